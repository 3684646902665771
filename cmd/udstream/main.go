package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr, interrupts()))
}

// interrupts is closed at the first SIGINT or SIGTERM.
func interrupts() <-chan struct{} {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGINT, syscall.SIGTERM)
	done := make(chan struct{})
	go func() { <-c; close(done) }()
	return done
}

const usage = `usage: udstream send [flags]   stream a file, stdin or a UDP/RTP feed to the receiver that asks
       udstream recv [flags]   ask a sender for its stream and write it to a file, stdout or UDP

Transports (-t, the same at both ends): wr-ud (RDMA Write-Record over UD,
partial records delivered with their valid ranges), wr-rd (Write-Record
over RD), send-ud (UD Send/Recv), rc (a byte stream over RC, TCP + MPA),
udp (plain UDP sockets, the baseline). docs/udstream.md has a walkthrough.
Run "udstream send -h" or "udstream recv -h" for the flags.
`

// run is udstream's entry point: exit 0 when the stream went through, 1
// when it failed on the way (the peer never answered or vanished, an
// input or output failed), 2 for bad flags or input it cannot stream.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer, stop <-chan struct{}) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stderr, usage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	var err error
	switch args[0] {
	case "send":
		err = send(args[1:], stdin, stdout, stderr, stop)
	case "recv":
		err = recv(args[1:], stdout, stderr, stop)
	default:
		err = badUse(fmt.Errorf("unknown command %q (send or recv)", args[0]))
	}
	var bu usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &bu):
		fmt.Fprintf(stderr, "udstream: %v\n", bu.error)
		return 2
	}
	fmt.Fprintf(stderr, "udstream: %v\n", err)
	return 1
}

// usageError is a mistake in what udstream was asked to do: exit 2.
type usageError struct{ error }

func badUse(err error) error { return usageError{err} }

// common are the flags both ends take.
type common struct {
	transport string
	loss      float64
	seed      uint64
	json      bool
	quiet     bool
	wait      time.Duration
}

func (c *common) register(fs *flag.FlagSet) {
	fs.StringVar(&c.transport, "t", tWRUD, "transport: "+strings.Join(transports, ", "))
	fs.Float64Var(&c.loss, "loss", 0, "drop this fraction of what this end sends (the impairment layer; udp: the same seeded draw before the socket)")
	fs.Uint64Var(&c.seed, "seed", 1, "seed of -loss")
	fs.BoolVar(&c.json, "json", false, "print the final figures as one JSON object on stdout (send) or stderr (recv with -o -)")
	fs.BoolVar(&c.quiet, "q", false, "no live line on stderr")
	fs.DurationVar(&c.wait, "wait", 30*time.Second, "how long to wait for the peer to appear")
}

func (c *common) check() error {
	switch {
	case !slices.Contains(transports, c.transport):
		return fmt.Errorf("-t %q: want one of %s", c.transport, strings.Join(transports, ", "))
	case c.loss < 0 || c.loss >= 1:
		return fmt.Errorf("-loss %v: want a fraction in [0, 1)", c.loss)
	case c.loss > 0 && (c.transport == tRC):
		return errors.New("-loss: rc is a TCP stream and loses nothing; drop its packets in the network (nftables, netem) instead")
	case c.wait <= 0:
		return fmt.Errorf("-wait %v: want a positive duration", c.wait)
	}
	return nil
}

// parse parses args into fs, refusing positional arguments.
func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return badUse(err)
	}
	if fs.NArg() > 0 {
		return badUse(fmt.Errorf("unexpected argument %q (flags only; -h lists them)", fs.Arg(0)))
	}
	return nil
}

// addrFlag checks a HOST:PORT flag.
func addrFlag(name, v string) (netip.AddrPort, error) {
	ap, err := netip.ParseAddrPort(v)
	if err != nil {
		return ap, badUse(fmt.Errorf("-%s %q: want IP:PORT (%v)", name, v, err))
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}

func network(ap netip.AddrPort) string {
	if ap.Addr().Is6() {
		return "udp6"
	}
	return "udp4"
}

// terminal reports whether w is a terminal (the live line goes there).
func terminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func printJSON(w io.Writer, v any) {
	b, _ := json.Marshal(v)
	fmt.Fprintln(w, string(b))
}
