package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
)

// Execute does what `sluice bench` does with cfg: validate it, run it (or
// sweep it), print the table to stdout, show progress on stderr per
// cfg.Progress, and write the JSON, CSV, requests CSV and SVG files named
// in cfg ("-" is stdout). A run interrupted through ctx still prints and
// writes what was measured, then returns the error.
func Execute(ctx context.Context, cfg Config, stdout, stderr io.Writer) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("invalid config: %w", err)
	}
	cfg = cfg.withDefaults()
	if w := fdWarning(cfg); w != "" {
		fmt.Fprintf(stderr, "sluice bench: warning: %s\n", w)
	}
	progress := progressWriter(cfg.Progress, stderr)
	if cfg.Sweep.Kind != "" {
		points, err := Sweep(ctx, cfg, progress)
		return errors.Join(err, writeSweep(cfg, points, stdout))
	}
	rep, err := Run(ctx, cfg, progress)
	if rep == nil {
		return err
	}
	return errors.Join(err, writeReport(cfg, rep, stdout))
}

// progressWriter returns where the live line goes: stderr when mode is
// always, or auto and stderr is a terminal; nil otherwise.
func progressWriter(mode string, stderr io.Writer) io.Writer {
	switch mode {
	case "always":
		return stderr
	case "never":
		return nil
	}
	if f, ok := stderr.(*os.File); ok && isTerminal(f) {
		return stderr
	}
	return nil
}

func writeReport(cfg Config, rep *Report, stdout io.Writer) error {
	errs := []error{rep.WriteTable(stdout)}
	errs = append(errs, writeFile(cfg.JSON, stdout, rep.WriteJSON))
	errs = append(errs, writeFile(cfg.CSV, stdout, rep.WriteCSV))
	errs = append(errs, writeFile(cfg.RequestsCSV, stdout, rep.WriteRequestsCSV))
	if cfg.SVG != "" {
		errs = append(errs, errors.New("svg output needs a sweep"))
	}
	return errors.Join(errs...)
}

func writeSweep(cfg Config, points []Point, stdout io.Writer) error {
	if len(points) == 0 {
		return nil
	}
	errs := []error{WriteSweepTable(stdout, points)}
	errs = append(errs, writeFile(cfg.JSON, stdout, func(w io.Writer) error {
		rep := &sweepJSON{Settings: settingsOf(cfg), Points: points}
		return rep.write(w)
	}))
	errs = append(errs, writeFile(cfg.CSV, stdout, func(w io.Writer) error { return WriteSweepCSV(w, points) }))
	errs = append(errs, writeFile(cfg.SVG, stdout, func(w io.Writer) error { return WriteSVG(w, points) }))
	if cfg.RequestsCSV != "" {
		errs = append(errs, errors.New("requests csv is not written for a sweep"))
	}
	return errors.Join(errs...)
}

// writeFile writes with fn to path ("-" is stdout); empty path: nothing.
func writeFile(path string, stdout io.Writer, fn func(io.Writer) error) error {
	switch path {
	case "":
		return nil
	case "-":
		return fn(stdout)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("creating output: %w", err)
	}
	if err := fn(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("closing %s: %w", path, err)
	}
	return nil
}
