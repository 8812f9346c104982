package main

// Tables that fit a terminal: 'outbox quarantine list' prints one row a
// line within 120 columns by default, eliding its long cells (--wide prints
// them whole).

import (
	"fmt"
	"io"
	"strings"
	"unicode"
	"unicode/utf8"
)

// defaultWidth is the width a table fits by default: the columns of a
// terminal the README's examples assume.
const defaultWidth = 120

// fitColumn is one column of a fitted table.
type fitColumn struct {
	header string
	// min is the width below which an elastic column is not shrunk; 0
	// marks a fixed column, printed whole.
	min int
	// weight is the column's share of the width when shrunk (0: 1): a
	// column of weight 2 is kept about twice as wide as one of weight 1.
	weight int
	// middle elides in the middle (an aggregate id keeps its end, where
	// ids usually differ) instead of at the end (an error's text).
	middle bool
}

// writeFitted writes the header and rows, each cell on one line (runs of
// white space and control characters become one space), the columns two
// spaces apart and no trailing space. With width > 0 the elastic columns
// are shrunk, the widest first, down to their min, so that every line has
// at most width runes (unless the fixed columns alone take more); a cut
// cell ends, or has in its middle, "…". With width 0 nothing is cut.
func writeFitted(w io.Writer, width int, cols []fitColumn, rows [][]string) {
	cells := make([][]string, len(rows))
	widths := make([]int, len(cols))
	for i, c := range cols {
		widths[i] = utf8.RuneCountInString(c.header)
	}
	for r, row := range rows {
		cells[r] = make([]string, len(cols))
		for i := range cols {
			cells[r][i] = cellLine(row[i])
			widths[i] = max(widths[i], utf8.RuneCountInString(cells[r][i]))
		}
	}
	if width > 0 {
		shrink(widths, cols, width)
	}
	line := func(row []string, elide bool) {
		var b strings.Builder
		for i, cell := range row {
			if elide {
				cell = elideTo(cell, widths[i], cols[i].middle)
			}
			if i == len(row)-1 {
				b.WriteString(cell)
				break
			}
			fmt.Fprintf(&b, "%-*s  ", widths[i], cell)
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
	headers := make([]string, len(cols))
	for i, c := range cols {
		headers[i] = c.header
	}
	line(headers, false)
	for _, row := range cells {
		line(row, true)
	}
}

// shrink narrows the elastic columns' widths until their sum with the gaps
// fits width: one rune at a time off the column widest for its weight
// still above its min (the header stays whole: a min is never below it).
func shrink(widths []int, cols []fitColumn, width int) {
	total := 2 * (len(widths) - 1)
	for _, n := range widths {
		total += n
	}
	for total > width {
		widest, most := -1, 0.0
		for i, c := range cols {
			floor := max(c.min, utf8.RuneCountInString(c.header))
			share := float64(widths[i]) / float64(max(c.weight, 1))
			if c.min > 0 && widths[i] > floor && (widest < 0 || share > most) {
				widest, most = i, share
			}
		}
		if widest < 0 {
			return
		}
		widths[widest]--
		total--
	}
}

// cellLine puts s on one line: runs of white space and control characters
// become one space, and the ends are trimmed.
func cellLine(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
	return strings.Join(strings.Fields(s), " ")
}

// elideTo cuts s to n runes, marking the cut with "…": at the end, or in
// the middle (keeping both ends).
func elideTo(s string, n int, middle bool) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	if n <= 1 {
		return "…"
	}
	if !middle {
		return string(r[:n-1]) + "…"
	}
	head := (n - 1) / 2
	tail := n - 1 - head
	return string(r[:head]) + "…" + string(r[len(r)-tail:])
}
