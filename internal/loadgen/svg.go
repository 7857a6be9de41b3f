package loadgen

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"strings"
)

// Plot geometry of WriteSVG, in pixels.
const (
	svgW, svgH                     = 880, 540
	plotL, plotR, plotT, plotB     = 90.0, 790.0, 60.0, 470.0
	colorTTFT, colorITL, colorKnee = "#1f77b4", "#d62728", "#2ca02c"
)

// WriteSVG draws the latency-throughput curve of a sweep as a
// self-contained SVG (no scripts, fonts or links): throughput (output
// tokens/s, or requests/s when no tokens were counted) on x, P95 TTFT on
// the left y axis and P95 ITL on the right one, each point labelled with
// its load level, and the knee (Point.Knee) circled and marked by a
// vertical line in a group with id "knee".
func WriteSVG(w io.Writer, points []Point) error {
	var b bytes.Buffer
	p := newPlot(points)
	fmt.Fprintf(&b, `<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">
<title>P95 latency vs throughput</title>
<rect x="0" y="0" width="%d" height="%d" fill="#ffffff"/>
<text x="%g" y="28" text-anchor="middle" font-size="16">%s</text>
`, svgW, svgH, svgW, svgH, svgW, svgH, (plotL+plotR)/2, esc(p.title()))
	p.axes(&b)
	p.series(&b, "ttft", colorTTFT, "", func(q Point) float64 { return ms(q.TTFT.P95) }, p.yL)
	p.series(&b, "itl", colorITL, "6 4", func(q Point) float64 { return ms(q.ITL.P95) }, p.yR)
	p.labels(&b)
	p.knee(&b)
	p.legend(&b)
	b.WriteString("</svg>\n")
	_, err := w.Write(b.Bytes())
	if err != nil {
		return fmt.Errorf("writing svg: %w", err)
	}
	return nil
}

// plot maps sweep points to the drawing.
type plot struct {
	pts        []Point
	x          func(i int) float64 // throughput of point i
	xUnit      string
	xs, yL, yR axis
}

// axis is a linear scale from 0 to ticks[len-1].
type axis struct {
	ticks []float64
	step  float64
}

func (a axis) max() float64 { return a.ticks[len(a.ticks)-1] }

func newPlot(points []Point) *plot {
	p := &plot{pts: points, x: throughputOf(points), xUnit: "requests/s"}
	for _, q := range points {
		if q.OutputTokensPerSec > 0 {
			p.xUnit = "output tokens/s" // throughputOf chose tokens too
		}
	}
	var mx, mt, mi float64
	for i, q := range points {
		mx, mt, mi = math.Max(mx, p.x(i)), math.Max(mt, ms(q.TTFT.P95)), math.Max(mi, ms(q.ITL.P95))
	}
	p.xs, p.yL, p.yR = niceAxis(mx), niceAxis(mt), niceAxis(mi)
	return p
}

func (p *plot) title() string {
	kind := "load"
	if len(p.pts) > 0 {
		kind = p.pts[0].Kind
	}
	return "P95 latency vs throughput, sweep of " + kind
}

// niceAxis picks 1-2-5 ticks from 0 past maxV (about five intervals).
func niceAxis(maxV float64) axis {
	if !(maxV > 0) || math.IsInf(maxV, 0) {
		maxV = 1
	}
	raw := maxV / 5
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := 10 * mag
	for _, m := range []float64{1, 2, 5} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	a := axis{step: step}
	for i := 0; ; i++ {
		v := float64(i) * step
		a.ticks = append(a.ticks, v)
		if v >= maxV*(1-1e-9) || i > 20 {
			return a
		}
	}
}

func (a axis) label(v float64) string {
	if a.step >= 1 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.*f", int(math.Ceil(-math.Log10(a.step))), v)
}

func (p *plot) px(v float64) float64 { return plotL + v/p.xs.max()*(plotR-plotL) }

func py(a axis, v float64) float64 { return plotB - v/a.max()*(plotB-plotT) }

func (p *plot) axes(b *bytes.Buffer) {
	b.WriteString(`<g id="grid" stroke="#e0e0e0" stroke-width="1">` + "\n")
	for _, t := range p.yL.ticks[1:] {
		fmt.Fprintf(b, `<line x1="%g" y1="%.1f" x2="%g" y2="%.1f"/>`+"\n", plotL, py(p.yL, t), plotR, py(p.yL, t))
	}
	b.WriteString("</g>\n")
	fmt.Fprintf(b, `<g id="axes" stroke="#000000" stroke-width="1">
<line x1="%g" y1="%g" x2="%g" y2="%g"/>
<line x1="%g" y1="%g" x2="%g" y2="%g"/>
<line x1="%g" y1="%g" x2="%g" y2="%g"/>
</g>
`, plotL, plotB, plotR, plotB, plotL, plotT, plotL, plotB, plotR, plotT, plotR, plotB)
	b.WriteString(`<g id="x-ticks" text-anchor="middle">` + "\n")
	for _, t := range p.xs.ticks {
		x := p.px(t)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%g" x2="%.1f" y2="%g" stroke="#000000"/><text x="%.1f" y="%g">%s</text>`+"\n",
			x, plotB, x, plotB+5, x, plotB+19, p.xs.label(t))
	}
	b.WriteString("</g>\n")
	p.yTicks(b, "y-left-ticks", p.yL, plotL, -1, colorTTFT)
	p.yTicks(b, "y-right-ticks", p.yR, plotR, 1, colorITL)
	fmt.Fprintf(b, `<text x="%g" y="%g" text-anchor="middle">%s</text>
<text transform="translate(28 %g) rotate(-90)" text-anchor="middle" fill="%s">P95 TTFT (ms)</text>
<text transform="translate(%g %g) rotate(90)" text-anchor="middle" fill="%s">P95 ITL (ms)</text>
`, (plotL+plotR)/2, plotB+45, esc(p.xUnit), (plotT+plotB)/2, colorTTFT, svgW-28.0, (plotT+plotB)/2, colorITL)
}

// yTicks draws the ticks of a y axis at x0; dir -1 puts labels left.
func (p *plot) yTicks(b *bytes.Buffer, id string, a axis, x0, dir float64, color string) {
	anchor := "end"
	if dir > 0 {
		anchor = "start"
	}
	fmt.Fprintf(b, `<g id="%s" fill="%s" text-anchor="%s">`+"\n", id, color, anchor)
	for _, t := range a.ticks {
		y := py(a, t)
		fmt.Fprintf(b, `<line x1="%g" y1="%.1f" x2="%g" y2="%.1f" stroke="%s"/><text x="%g" y="%.1f">%s</text>`+"\n",
			x0, y, x0+5*dir, y, color, x0+8*dir, y+4, a.label(t))
	}
	b.WriteString("</g>\n")
}

func (p *plot) series(b *bytes.Buffer, id, color, dash string, val func(Point) float64, a axis) {
	var pts []string
	for i, q := range p.pts {
		pts = append(pts, fmt.Sprintf("%.1f,%.1f", p.px(p.x(i)), py(a, val(q))))
	}
	dashAttr := ""
	if dash != "" {
		dashAttr = ` stroke-dasharray="` + dash + `"`
	}
	fmt.Fprintf(b, `<g id="%s" stroke="%s" fill="%s">`+"\n", id, color, color)
	fmt.Fprintf(b, `<polyline fill="none" stroke-width="2"%s points="%s"/>`+"\n", dashAttr, strings.Join(pts, " "))
	for i, q := range p.pts {
		x, y := p.px(p.x(i)), py(a, val(q))
		tip := fmt.Sprintf("%s: %.0f %s, P95 %s %.2f ms", q.Label(), p.x(i), p.xUnit, id, val(q))
		if dash == "" {
			fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="4"><title>%s</title></circle>`+"\n", x, y, esc(tip))
		} else {
			fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="7" height="7"><title>%s</title></rect>`+"\n", x-3.5, y-3.5, esc(tip))
		}
	}
	b.WriteString("</g>\n")
}

func (p *plot) labels(b *bytes.Buffer) {
	b.WriteString(`<g id="point-labels" font-size="10" fill="#333333" text-anchor="middle">` + "\n")
	for i, q := range p.pts {
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f">%s</text>`+"\n", p.px(p.x(i)), py(p.yL, ms(q.TTFT.P95))-9, esc(q.Label()))
	}
	b.WriteString("</g>\n")
}

func (p *plot) knee(b *bytes.Buffer) {
	for i, q := range p.pts {
		if !q.Knee {
			continue
		}
		x, y := p.px(p.x(i)), py(p.yL, ms(q.TTFT.P95))
		fmt.Fprintf(b, `<g id="knee" stroke="%s" fill="none" stroke-width="2">
<line x1="%.1f" y1="%g" x2="%.1f" y2="%g" stroke-dasharray="3 3"/>
<circle cx="%.1f" cy="%.1f" r="10"/>
<text x="%.1f" y="%g" fill="%s" stroke="none" text-anchor="middle">knee (%s)</text>
</g>
`, colorKnee, x, plotT, x, plotB, x, y, x, plotT-6, colorKnee, esc(q.Label()))
		return
	}
	fmt.Fprintf(b, `<text id="no-knee" x="%g" y="%g" text-anchor="end" fill="#666666">no knee within the sweep</text>`+"\n", plotR-6, plotT+16)
}

func (p *plot) legend(b *bytes.Buffer) {
	fmt.Fprintf(b, `<g id="legend">
<rect x="%g" y="%g" width="280" height="60" fill="#ffffff" stroke="#cccccc"/>
<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="%s" stroke-width="2"/><text x="%g" y="%g">P95 TTFT (left axis)</text>
<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="%s" stroke-width="2" stroke-dasharray="6 4"/><text x="%g" y="%g">P95 ITL (right axis)</text>
<text x="%g" y="%g" font-size="10" fill="#666666">knee: P95 TTFT &gt; 2× low-load or gain &lt; 10%%</text>
</g>
`, plotL+10, plotT+8,
		plotL+18, plotT+22, plotL+48, plotT+22, colorTTFT, plotL+54, plotT+26,
		plotL+18, plotT+38, plotL+48, plotT+38, colorITL, plotL+54, plotT+42,
		plotL+18, plotT+58)
}

// esc escapes text for XML character data and attribute values.
func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}
