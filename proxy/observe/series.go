package observe

import (
	"fmt"
	"sync"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

// seriesSet is what the own sharded vectors (shardCounterVec,
// shardHistVec) share: their series by label values, each made the first
// time its values are asked for, and the Collector's two methods.
type seriesSet[T prometheus.Metric] struct {
	desc   *prometheus.Desc
	name   string
	labels int                  // variable label names
	newT   func(lvs []string) T // makes the series of lvs (under mu)

	mu       sync.RWMutex
	children map[string]T
}

func newSeriesSet[T prometheus.Metric](name, help string, labels []string, newT func([]string) T) seriesSet[T] {
	return seriesSet[T]{desc: prometheus.NewDesc(name, help, labels, nil), name: name, labels: len(labels),
		newT: newT, children: map[string]T{}}
}

// WithLabelValues returns the series of the label values, in the order of
// the label names, making it the first time; it panics, as client_golang's
// vectors do, on a wrong count or a value that is not valid UTF-8.
func (s *seriesSet[T]) WithLabelValues(lvs ...string) T {
	if len(lvs) != s.labels {
		panic(fmt.Errorf("%s: expected %d label values but got %d in %#v", s.name, s.labels, len(lvs), lvs))
	}
	key := ""
	for _, l := range lvs {
		if !utf8.ValidString(l) {
			panic(fmt.Errorf("label value %q is not valid UTF-8", l))
		}
		key += l + "\xff"
	}
	s.mu.RLock()
	t, ok := s.children[key]
	s.mu.RUnlock()
	if ok {
		return t
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok = s.children[key]; !ok {
		t = s.newT(lvs)
		s.children[key] = t
	}
	return t
}

// Describe implements prometheus.Collector.
func (s *seriesSet[T]) Describe(ch chan<- *prometheus.Desc) { ch <- s.desc }

// Collect implements prometheus.Collector.
func (s *seriesSet[T]) Collect(ch chan<- prometheus.Metric) {
	s.mu.RLock()
	ts := make([]T, 0, len(s.children))
	for _, t := range s.children {
		ts = append(ts, t)
	}
	s.mu.RUnlock()
	for _, t := range ts {
		ch <- t
	}
}
