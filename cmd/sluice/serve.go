package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/sluice-proxy/sluice/configs"
	"github.com/sluice-proxy/sluice/internal/node"
	"github.com/sluice-proxy/sluice/proxy/listen"
	"github.com/sluice-proxy/sluice/proxy/observe"
)

// demoKey is the embedded default's demo tenant key; the config holds only
// its hash, and the banner prints it so a newcomer can paste a curl command.
const demoKey = "sk-sluice-demo"

func cmdServe(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	file := configFlag(fs, "config `file`; without it and $SLUICE_CONFIG, the embedded default")
	logFormat := fs.String("log-format", "json", "log format: json or text")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn or error")
	pprofOn := fs.Bool("pprof", false, "serve Go's profiler (net/http/pprof) under /debug/pprof/ on the admin listener")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: sluice serve [-c FILE] [flags]\n\nServes a config file (-c, else $SLUICE_CONFIG), or the embedded default without either.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return flagExit(err)
	}
	lw := observe.NewLogWriter(stderr)
	defer lw.Close() // the access log's buffered lines are written before the process exits
	log, access, err := newLogger(lw, *logFormat, *logLevel)
	if err != nil {
		fmt.Fprintf(stderr, "sluice: %v\n", err)
		return 2
	}
	applyRuntimeDefaults(log)
	var cfg *configs.Config
	if *file == "" {
		cfg, err = configs.Default()
	} else {
		cfg, err = configs.Load(*file)
	}
	if err != nil {
		for _, e := range configs.Errors(err) {
			fmt.Fprintln(stderr, e)
		}
		return 1
	}
	if a := cfg.Node.AccessLog; a.Buffer > 0 && access != nil {
		lw.SetBuffer(int(a.Buffer), a.Flush)
		log.Info("access log buffered", "buffer", a.Buffer.String(), "flush", a.Flush.String())
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	n, err := node.Start(context.Background(), cfg, node.Options{Log: log, AccessLog: access, Version: strings.Fields(versionString())[1]})
	if err != nil {
		fmt.Fprintf(stderr, "sluice: %v\n", err)
		return 1
	}
	if *pprofOn {
		n.EnablePprof()
	}
	if err := n.WatchConfig(); err != nil {
		log.Warn("config file changes will not be noticed; reload with SIGHUP or POST /-/reload", "err", err)
	}
	printBanner(stdout, n, *file == "")
	serveUntilSignal(n, sigs, log)
	// A second SIGINT or SIGTERM now stops the process at once.
	signal.Reset(syscall.SIGINT, syscall.SIGTERM)
	if err := n.Shutdown(); err != nil {
		log.Warn("shutdown", "err", err)
	}
	n.Close()
	return 0
}

// serveUntilSignal serves until a shutdown signal (SIGINT, SIGTERM) or a
// listener failure. SIGHUP reloads the config (and certificates) meanwhile.
func serveUntilSignal(n *node.Node, sigs <-chan os.Signal, log *slog.Logger) {
	for {
		select {
		case sig := <-sigs:
			if sig == syscall.SIGHUP {
				n.Reload(node.TriggerSIGHUP)
				continue
			}
			cfg := n.Config()
			log.Info("shutting down", "signal", sig.String(), "drain_delay", cfg.Node.DrainDelay, "drain_timeout", cfg.Node.DrainTimeout)
			return
		case err := <-n.Err():
			log.Error("listener failed", "err", err)
			return
		}
	}
}

// newLogger returns the node's log and its access log, both writing to w
// in the same format; the access log's lines are at level info, so it is
// nil when level is above that. When w is an *observe.LogWriter, the
// access log's lines go through its buffer (node.access_log).
func newLogger(w io.Writer, format, level string) (*slog.Logger, *observe.AccessLog, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, nil, fmt.Errorf("bad -log-level %q", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	var log *slog.Logger
	switch format {
	case "json":
		log = slog.New(slog.NewJSONHandler(w, opts))
	case "text":
		log = slog.New(slog.NewTextHandler(w, opts))
	default:
		return nil, nil, fmt.Errorf("bad -log-format %q (json or text)", format)
	}
	var access *observe.AccessLog
	if lv <= slog.LevelInfo {
		access = observe.NewAccessLog(w, format)
	}
	return log, access, nil
}

// printBanner says where the node listens and how to try it.
func printBanner(w io.Writer, n *node.Node, embedded bool) {
	cfg := n.Config()
	fmt.Fprintf(w, "%s: node %s, region %s\n", versionString(), cfg.Node.Name, cfg.Node.Region)
	if a := n.Server().Addr(listen.ListenerHTTP); a != "" {
		fmt.Fprintf(w, "  http   http://%s   HTTP/1.1 and h2c\n", a)
	}
	if a := n.Server().Addr(listen.ListenerHTTPS); a != "" {
		fmt.Fprintf(w, "  https  https://%s   HTTP/1.1 and HTTP/2", a)
		if pins := n.Certs().Pins(); cfg.Listeners.HTTPS.DevCert && len(pins) > 0 {
			fmt.Fprintf(w, "; dev certificate, SPKI pin sha256//%s", pins[0])
		}
		fmt.Fprintln(w)
	}
	if a := n.Server().Addr(listen.ListenerHTTP3); a != "" {
		fmt.Fprintf(w, "  http3  https://%s   HTTP/3 over QUIC (UDP), advertised to TLS clients with Alt-Svc\n", a)
	}
	if a := n.Server().Addr(listen.ListenerAdmin); a != "" {
		fmt.Fprintf(w, "  admin  http://%s   status page /, /debug/stats, /debug/config, /metrics, /healthz, /readyz\n", a)
	}
	for _, s := range cfg.Simulators {
		fmt.Fprintf(w, "  simulated GPU %q serving %s at %s\n", s.Name, s.Model, n.SimURL(s.Name))
	}
	base := ""
	if a := n.Server().Addr(listen.ListenerHTTP); a != "" {
		base = "http://" + a
	} else if a := n.Server().Addr(listen.ListenerHTTPS); a != "" {
		base = "https://" + a
	}
	model := "MODEL"
	if ms := n.Handler().State().Routes.Models(""); len(ms) > 0 {
		model = ms[0]
	}
	key := "$SLUICE_API_KEY"
	if embedded && n.Handler().State().Tenants.Lookup(demoKey) != nil {
		key = demoKey
	}
	defer printHTTP3(w, n, key, model)
	if base == "" {
		return
	}
	fmt.Fprintf(w, "\nTry it:\n  curl -N%s %s/v1/chat/completions \\\n    -H 'Authorization: Bearer %s' \\\n    -d '{\"model\":\"%s\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}'\n\n",
		map[bool]string{true: " -k", false: ""}[strings.HasPrefix(base, "https")], base, key, model)
}
