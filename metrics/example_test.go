package metrics_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/udiwarp/udiwarp/metrics"
	"github.com/udiwarp/udiwarp/qp"
)

// A program that embeds the library registers one collector for its
// devices and serves it with promhttp.
func ExampleCollector() {
	dev, err := qp.Open(qp.DeviceConfig{})
	if err != nil {
		panic(err)
	}
	defer dev.Close()

	c := metrics.New()
	c.Add("dev0", dev)
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))

	srv := httptest.NewServer(mux) // in a program: http.ListenAndServe(":9100", mux)
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		panic(err)
	}
	resp.Body.Close()
	fmt.Println(resp.Status, c.Devices())
	// Output: 200 OK 1
}
