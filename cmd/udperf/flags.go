package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// Flag parsing shared by every subcommand: a bad flag or value is one line
// on stderr naming the flag and exit 2, never the usage dump; -h prints
// the subcommand's usage on stdout and exits 0; a stray positional
// argument is refused (one that names a mode is answered "did you mean
// -mode M?").

// command is a subcommand's flag set and how it presents itself.
type command struct {
	fs       *flag.FlagSet
	synopsis string // "udperf local [flags]"
	about    string // a line or two under the synopsis
	// positional, when set, takes the arguments after the flags (decode's
	// hex); otherwise any is refused.
	positional bool
	// notFor names flags registered for this command (they share a
	// register function) that it does not act on, with the reason: given,
	// they are refused in one line; -h does not list them.
	notFor map[string]string
	// refused is set by a refusedFlag's Set: the line to print instead of
	// the flag package's own.
	refused string
}

func newCommand(name, synopsis, about string) *command {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are ours to print, in one line
	fs.Usage = func() {}
	return &command{fs: fs, synopsis: synopsis, about: about}
}

// parse parses args. It returns ok, or the exit code the command returns
// at once: 0 after -h (usage on stdout), 2 after a bad flag (one line on
// stderr).
func (c *command) parse(args []string, stdout, stderr io.Writer) (code int, ok bool) {
	err := c.fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		c.usage(stdout)
		return 0, false
	}
	name := c.fs.Name()
	if err != nil {
		if c.refused != "" {
			fmt.Fprintf(stderr, "udperf %s: %s\n", name, c.refused)
		} else {
			fmt.Fprintf(stderr, "udperf %s: %v (udperf %s -h lists the flags)\n", name, err, name)
		}
		return 2, false
	}
	var notFor string
	c.fs.Visit(func(f *flag.Flag) {
		if why, ok := c.notFor[f.Name]; ok && notFor == "" {
			notFor = fmt.Sprintf("-%s does not apply to %s: %s", f.Name, name, why)
		}
	})
	if notFor != "" {
		fmt.Fprintf(stderr, "udperf %s: %s\n", name, notFor)
		return 2, false
	}
	if rest := c.fs.Args(); len(rest) > 0 && !c.positional {
		fmt.Fprintf(stderr, "udperf %s: %s\n", name, strayArgument(name, rest[0]))
		return 2, false
	}
	return 0, true
}

// strayArgument is the line that refuses a positional argument.
func strayArgument(cmd, arg string) string {
	ms := strings.Split(arg, ",")
	for _, s := range ms {
		if _, err := parseMode(s); err != nil {
			if strings.HasPrefix(arg, "-") {
				return fmt.Sprintf("unexpected argument %q: flags go before any other argument", arg)
			}
			return fmt.Sprintf("unexpected argument %q (udperf %s takes flags only; udperf %s -h lists them)", arg, cmd, cmd)
		}
	}
	if cmd == "compare" {
		return fmt.Sprintf("did you mean -modes %s?", arg)
	}
	if len(ms) > 1 {
		return fmt.Sprintf("did you mean udperf compare -modes %s?", arg)
	}
	return fmt.Sprintf("did you mean -mode %s?", arg)
}

// set reports whether the flag was given on the command line.
func (c *command) set(name string) bool {
	given := false
	c.fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

// usage prints the synopsis and the flags this command acts on.
func (c *command) usage(w io.Writer) {
	fmt.Fprintf(w, "usage: %s\n", c.synopsis)
	if c.about != "" {
		fmt.Fprintf(w, "\n%s\n", c.about)
	}
	shown := flag.NewFlagSet(c.fs.Name(), flag.ContinueOnError)
	n := 0
	c.fs.VisitAll(func(f *flag.Flag) {
		if _, hidden := c.notFor[f.Name]; hidden {
			return
		}
		if _, ok := f.Value.(*refusedFlag); ok {
			return
		}
		shown.Var(f.Value, f.Name, f.Usage)
		n++
	})
	if n > 0 {
		fmt.Fprintln(w, "\nflags:")
		shown.SetOutput(w)
		shown.PrintDefaults()
	}
}

// secondsFlag is a duration given as perftest does, in seconds (-D 3,
// -D 0.5), or as a Go duration (-D 500ms).
type secondsFlag struct{ d *time.Duration }

func (s secondsFlag) String() string {
	if s.d == nil {
		return "0s"
	}
	return s.d.String()
}

func (s secondsFlag) Set(v string) error {
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		if f <= 0 || f > 1e6 {
			return errors.New("want a positive number of seconds")
		}
		*s.d = time.Duration(f * float64(time.Second))
		return nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return errors.New("want seconds (3, 0.5) or a Go duration (500ms, 2s)")
	}
	if d <= 0 {
		return errors.New("want a positive duration")
	}
	*s.d = d
	return nil
}

func (s secondsFlag) Get() any { return *s.d }

// eventFlag is perftest's -e: -poll event.
type eventFlag struct{ poll *string }

func (e eventFlag) String() string   { return "false" }
func (e eventFlag) IsBoolFlag() bool { return true }
func (e eventFlag) Get() any         { return e.poll != nil && *e.poll == "event" }

func (e eventFlag) Set(v string) error {
	b, err := strconv.ParseBool(v)
	if err != nil {
		return err
	}
	if b {
		*e.poll = "event"
	}
	return nil
}

// noopFlag is a perftest habit accepted and ignored (-F, --report_gbits).
type noopFlag struct{ given bool }

func (n *noopFlag) String() string   { return "false" }
func (n *noopFlag) IsBoolFlag() bool { return true }
func (n *noopFlag) Get() any         { return n.given }

func (n *noopFlag) Set(v string) error {
	b, err := strconv.ParseBool(v)
	n.given = b
	return err
}

// refusedFlag is a perftest flag with no meaning here (-d, -i): given, the
// command is refused with its hint.
type refusedFlag struct {
	cmd  *command
	name string
	hint string
}

func (r *refusedFlag) String() string { return "" }

func (r *refusedFlag) Set(string) error {
	r.cmd.refused = fmt.Sprintf("-%s: %s", r.name, r.hint)
	return errors.New(r.hint)
}

// perftestHabits registers what a perftest user types out of habit: -e
// (event polling; poll is the -poll flag's variable), -F and --report_gbits
// (no-ops), and -d and -i (refused with a hint). poll may be nil for a
// command that does not poll.
func (c *command) perftestHabits(poll *string) {
	if poll != nil {
		c.fs.Var(eventFlag{poll}, "e", "perftest's -e: the same as -poll event")
	}
	c.fs.Var(&noopFlag{}, "F", "accepted for perftest's habit and ignored (udperf checks no CPU frequency)")
	c.fs.Var(&noopFlag{}, "report_gbits", "accepted for perftest's habit and ignored (figures are in Gb/s already)")
	c.noDevice()
}

// noDevice registers perftest's -d and -i (device and port), refused with
// a hint: there is no device to pick.
func (c *command) noDevice() {
	where := "use -addr HOST:PORT to pick the far end"
	switch c.fs.Name() {
	case "local", "compare":
		where = "udperf " + c.fs.Name() + " runs over loopback; udperf server and client -addr HOST:PORT run between hosts"
	case "server":
		where = "use -addr to pick the address to listen on"
	}
	c.fs.Var(&refusedFlag{c, "d", "udiwarp has no device to pick: it runs over UDP/TCP sockets (the kernel picks the interface); " + where}, "d", "")
	c.fs.Var(&refusedFlag{c, "i", "udiwarp has no device port to pick: it runs over UDP/TCP sockets; " + where}, "i", "")
}
