package outboxconsole

import (
	"fmt"
	"math"
	"time"

	"github.com/pgoutbox/outbox"
)

// chart is a per-minute bar chart (events published, failures, backlog,
// latency), laid out on the server and drawn by the template as inline SVG.
type chart struct {
	Width, Height, PlotHeight float64
	Bars                      []bar
	Max, Total                int64
	// MaxLabel is the scale's top (for a count chart, a count; see Scale);
	// AxisY where the time axis is drawn.
	MaxLabel string
	AxisY    float64
	Labels   []chartLabel
	// ID names the chart in the page; Title is its heading, Label what a
	// screen reader says of it, Scale the text at the top left ("max
	// 1,204/min"), Summary the heading's figure ("12,345 in all").
	ID, Title, Label, Scale, Summary string
	// Bad marks a chart whose figures are alarming (failures).
	Bad bool
}

type bar struct {
	X, Y, W, H float64
	Title      string
}

type chartLabel struct {
	X    float64
	Text string
	// Anchor is the SVG text-anchor: the first and last labels hold to the
	// chart's edges.
	Anchor string
}

const (
	chartWidth  = 1200
	chartHeight = 160
	chartPlot   = 136 // the bars' area; the rest holds the time labels
	// smallChartWidth is the width of the charts shown three abreast.
	smallChartWidth = 420
)

// newChart lays out one bar per minute of series (oldest first, as
// Admin.PublishedPerMinute returns it).
func newChart(series []outbox.MinuteCount, now time.Time) chart {
	minutes := make([]time.Time, len(series))
	values := make([]float64, len(series))
	for i, m := range series {
		minutes[i], values[i] = m.Minute, float64(m.Published)
	}
	c := minuteChart(chartWidth, minutes, values, now, func(i int) string {
		return fmt.Sprintf("%s: %s published", series[i].Minute.Format("15:04"), fmtNum(series[i].Published))
	})
	c.MaxLabel = fmtNum(c.Max)
	c.Scale = "max " + c.MaxLabel + "/min"
	return c
}

// minuteChart lays out, width wide, one bar per minute (values oldest first, none
// negative), scaled to the largest, each titled by title(i); the time axis
// is labelled in minutes before now.
func minuteChart(width float64, minutes []time.Time, values []float64, now time.Time, title func(i int) string) chart {
	c := chart{Width: width, Height: chartHeight, PlotHeight: chartPlot, AxisY: chartPlot + 0.5}
	top := 0.0
	for _, v := range values {
		top = max(top, v)
		c.Total += int64(math.Round(v))
	}
	c.Max = int64(math.Ceil(top))
	if len(values) == 0 {
		return c
	}
	step := width / float64(len(values))
	for i, v := range values {
		h := 0.0
		if top > 0 {
			h = float64(chartPlot-4) * v / top
		}
		if v > 0 && h < 1 {
			h = 1
		}
		c.Bars = append(c.Bars, bar{X: float64(i)*step + 1, Y: chartPlot - h, W: max(step-2, 1), H: h, Title: title(i)})
	}
	n := len(values)
	for _, i := range []int{0, n / 4, n / 2, 3 * n / 4, n - 1} {
		mins := int(now.Sub(minutes[i]).Minutes())
		text := fmt.Sprintf("-%dm", mins)
		if i == n-1 {
			text = "now"
		}
		l := chartLabel{X: float64(i)*step + step/2, Text: text, Anchor: "middle"}
		switch i {
		case 0:
			l.X, l.Anchor = 0, "start"
		case n - 1:
			l.X, l.Anchor = width, "end"
		}
		c.Labels = append(c.Labels, l)
	}
	return c
}

// historyCharts lays out the overview's charts of the last hour beside the
// published one: failed publish attempts, the backlog (unsettled events)
// and the commit→ack latency, from Admin.History.
func historyCharts(h []outbox.MinuteHistory, now time.Time) []chart {
	minutes := make([]time.Time, len(h))
	failed, unsettled, latency := make([]float64, len(h)), make([]float64, len(h)), make([]float64, len(h))
	var maxLatency float64
	for i, m := range h {
		minutes[i] = m.Minute
		failed[i], unsettled[i], latency[i] = float64(m.Failed), float64(m.Unsettled), m.LatencyP50Seconds
		maxLatency = max(maxLatency, m.LatencyMaxSeconds)
	}
	at := func(i int) string { return h[i].Minute.Format("15:04") }
	f := minuteChart(smallChartWidth, minutes, failed, now, func(i int) string { return fmt.Sprintf("%s: %s failed", at(i), fmtNum(h[i].Failed)) })
	f.ID, f.Title, f.Label = "chart-failed", "Failed publish attempts per minute", "failed publish attempts per minute over the last hour"
	f.Scale, f.Summary, f.Bad = "max "+fmtNum(f.Max)+"/min", fmtNum(f.Total)+" in all, as the relays recorded them", f.Total > 0
	u := minuteChart(smallChartWidth, minutes, unsettled, now, func(i int) string {
		return fmt.Sprintf("%s: %s unsettled at the minute's end", at(i), fmtNum(h[i].Unsettled))
	})
	u.ID, u.Title, u.Label = "chart-backlog", "Backlog", "unsettled events at the end of each minute over the last hour"
	u.Scale, u.Summary = "max "+fmtNum(u.Max), "unsettled events, quarantined included, at each minute's end"
	l := minuteChart(smallChartWidth, minutes, latency, now, func(i int) string {
		if h[i].Published == 0 {
			return at(i) + ": nothing published"
		}
		return fmt.Sprintf("%s: commit→ack p50 %s, max %s", at(i), fmtSeconds(h[i].LatencyP50Seconds), fmtSeconds(h[i].LatencyMaxSeconds))
	})
	l.ID, l.Title, l.Label = "chart-latency", "Commit→ack latency", "median commit to acknowledgement latency per minute over the last hour"
	l.Scale, l.Summary = "max p50 "+fmtSeconds(maxOf(latency)), "median per minute; the longest "+fmtSeconds(maxLatency)
	return []chart{f, u, l}
}

func maxOf(v []float64) float64 {
	m := 0.0
	for _, x := range v {
		m = max(m, x)
	}
	return m
}

// fmtSeconds shows a latency: milliseconds below a second, seconds below a
// minute, then as an age.
func fmtSeconds(s float64) string {
	switch {
	case s < 1:
		return fmt.Sprintf("%.0f ms", s*1000)
	case s < 60:
		return fmt.Sprintf("%.1f s", s)
	}
	return fmtAge(s)
}
