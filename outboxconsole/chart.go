package outboxconsole

import (
	"fmt"
	"time"

	"github.com/pgoutbox/outbox"
)

// chart is the published-per-minute bar chart, laid out on the server and
// drawn by the template as inline SVG.
type chart struct {
	Width, Height, PlotHeight float64
	Bars                      []bar
	Max, Total                int64
	// MaxLabel is the scale's top; AxisY where the time axis is drawn.
	MaxLabel string
	AxisY    float64
	Labels   []chartLabel
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
)

// newChart lays out one bar per minute of series (oldest first, as
// Admin.PublishedPerMinute returns it).
func newChart(series []outbox.MinuteCount, now time.Time) chart {
	c := chart{Width: chartWidth, Height: chartHeight, PlotHeight: chartPlot, AxisY: chartPlot + 0.5}
	for _, m := range series {
		c.Max = max(c.Max, m.Published)
		c.Total += m.Published
	}
	c.MaxLabel = fmtNum(c.Max)
	if len(series) == 0 {
		return c
	}
	step := float64(chartWidth) / float64(len(series))
	for i, m := range series {
		h := 0.0
		if c.Max > 0 {
			h = float64(chartPlot-4) * float64(m.Published) / float64(c.Max)
		}
		if m.Published > 0 && h < 1 {
			h = 1
		}
		c.Bars = append(c.Bars, bar{X: float64(i)*step + 1, Y: chartPlot - h, W: max(step-2, 1), H: h,
			Title: fmt.Sprintf("%s: %s published", m.Minute.Format("15:04"), fmtNum(m.Published))})
	}
	for _, i := range []int{0, len(series) / 4, len(series) / 2, 3 * len(series) / 4, len(series) - 1} {
		mins := int(now.Sub(series[i].Minute).Minutes())
		text := fmt.Sprintf("-%dm", mins)
		if i == len(series)-1 {
			text = "now"
		}
		l := chartLabel{X: float64(i)*step + step/2, Text: text, Anchor: "middle"}
		switch i {
		case 0:
			l.X, l.Anchor = 0, "start"
		case len(series) - 1:
			l.X, l.Anchor = chartWidth, "end"
		}
		c.Labels = append(c.Labels, l)
	}
	return c
}
