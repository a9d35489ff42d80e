package debezium

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

const usage = `Usage:
  outboxd debezium convert [-brokers HOST:PORT,...] [-o FILE] CONNECTOR_CONFIG

Reads a Debezium PostgreSQL connector configuration that uses the Outbox
EventRouter -- JSON as posted to Kafka Connect ({"name":...,"config":{...}} or
the bare config object) or a .properties file; "-" reads standard input --
and writes the equivalent outboxd configuration (YAML) to standard output or
FILE. Settings outboxd does not honour are listed on standard error as
warnings. The password is never copied: the warnings say how to supply it.
See docs/migrating-from-debezium.md.

Flags:
`

// Command runs "outboxd debezium ARGS...". Warnings go to stderr; the
// configuration to stdout or -o FILE. It returns an error for unusable
// input; the caller prints it and exits 1.
func Command(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "convert" {
		fmt.Fprint(stderr, usage)
		if len(args) == 0 {
			return errors.New("debezium: missing subcommand convert")
		}
		return fmt.Errorf("debezium: unknown subcommand %q; the only one is convert", args[0])
	}
	fs := flag.NewFlagSet("outboxd debezium convert", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	out := fs.String("o", "", "write the configuration to `FILE` instead of standard output")
	brokers := fs.String("brokers", "", "Kafka bootstrap servers, `HOST:PORT,...` (a connector configuration does not name them)")
	printUsage := func() {
		fmt.Fprint(stderr, usage)
		fs.SetOutput(stderr)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
	// Flags may come before or after the file, as users type them.
	rest, files := args[1:], []string(nil)
	for {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				printUsage()
				return nil
			}
			printUsage()
			return fmt.Errorf("debezium convert: %w", err)
		}
		if fs.NArg() == 0 {
			break
		}
		files, rest = append(files, fs.Arg(0)), fs.Args()[1:]
	}
	if err := fs.Parse(files); err != nil { // leaves the files as the arguments
		return fmt.Errorf("debezium convert: %w", err)
	}
	if fs.NArg() != 1 {
		printUsage()
		return fmt.Errorf("debezium convert: want one connector configuration file, got %d arguments", fs.NArg())
	}
	path := fs.Arg(0)
	var data []byte
	var err error
	if path == "-" {
		data, err = io.ReadAll(stdin)
	} else {
		data, err = os.ReadFile(path)
	}
	if err != nil {
		return fmt.Errorf("reading connector configuration: %w", err)
	}
	format := Auto
	switch strings.ToLower(filepath.Ext(path)) {
	case ".json":
		format = JSON
	case ".properties":
		format = Properties
	}
	c, err := Parse(data, format)
	if err != nil {
		return fmt.Errorf("connector configuration %s: %w", path, err)
	}
	var opts Options
	for _, b := range strings.Split(*brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			opts.Brokers = append(opts.Brokers, b)
		}
	}
	res, err := Convert(c, opts)
	if err != nil {
		return fmt.Errorf("connector configuration %s: %w", path, err)
	}
	for _, w := range res.Warnings {
		fmt.Fprintf(stderr, "warning: %s\n", w)
	}
	if *out == "" {
		_, err = stdout.Write(res.YAML)
		return err
	}
	if err := os.WriteFile(*out, res.YAML, 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", *out, err)
	}
	fmt.Fprintf(stderr, "wrote %s; check it with: outboxd -config %s -check-config\n", *out, *out)
	return nil
}
