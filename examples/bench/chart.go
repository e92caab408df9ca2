//go:build unix

package main

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"os"
	"unicode"
)

// chartPanel is one group of bars sharing a linear scale.
type chartPanel struct {
	title string
	keys  []string
}

var chartPanels = []chartPanel{
	{"single-message writes, msgs/s", []string{"single", "insert", "pgq-single"}},
	{"1000-message writes, msgs/s", []string{"batch", "wide", "copy", "river-insert", "pgq-copy", "pgq-insert-batch"}},
	{"drain, msgs/s (handled and acked / completed)", []string{"drain", "river-drain", "pgq-drain"}},
}

var chartLabels = map[string]string{
	"single":       "queen push x1, 1000 goroutines",
	"insert":       "INSERT commit x1, 64 conns",
	"batch":        "queen push x1000, 8 goroutines",
	"wide":         "queen push x1000, 100k partitions",
	"copy":         "COPY 1000 rows, 8 goroutines",
	"river-insert": "River InsertMany 1000, 8 gor.",
	"drain":        "queen Consume, batch 1000",
	"river-drain":  "River workers, no-op jobs",
	// PgQ (pgq.go).
	"pgq-single":       "PgQ insert_event x1, 64 conns",
	"pgq-copy":         "PgQ COPY 1000 events, 8 gor.",
	"pgq-insert-batch": "PgQ insert_event x1000, 8 gor.",
	"pgq-drain":        "PgQ next_batch, 1000 per tick",
}

var (
	colBG      = color.RGBA{255, 255, 255, 255}
	colText    = color.RGBA{30, 30, 30, 255}
	colGrid    = color.RGBA{225, 225, 225, 255}
	colQueen   = color.RGBA{0, 128, 128, 255}
	colBase    = color.RGBA{150, 150, 150, 255}
	colRiver   = color.RGBA{214, 120, 40, 255}
	colCapped  = color.RGBA{180, 40, 40, 255}
	colSubtext = color.RGBA{90, 90, 90, 255}
)

const (
	chartW   = 1280
	scale    = 2 // font scale: glyphs are 10×14 px, 12 px per character
	labelW   = 34 * 6 * scale
	barX     = 30 + labelW
	barMaxW  = chartW - barX - 190
	rowH     = 34
	barH     = 22
	panelGap = 24
)

// writeChart draws horizontal bars of msgs/s, one panel per scenario
// family, and the end-to-end latency as a footnote.
func writeChart(path, title, subtitle string, rs []*result) error {
	by := map[string]*result{}
	for _, r := range rs {
		by[r.Key] = r
	}
	h := 76
	for _, p := range chartPanels {
		n := 0
		for _, k := range p.keys {
			if by[k] != nil {
				n++
			}
		}
		if n > 0 {
			h += 30 + n*rowH + panelGap
		}
	}
	h += 20
	for _, r := range rs {
		if r.Offered > 0 && r.Unavailable == "" {
			h += 14
		}
	}
	img := image.NewRGBA(image.Rect(0, 0, chartW, h))
	draw.Draw(img, img.Bounds(), &image.Uniform{colBG}, image.Point{}, draw.Src)
	drawText(img, 20, 16, title, 1, colText)
	drawText(img, 20, 30, subtitle, 1, colSubtext)
	drawText(img, 20, 44, "teal: queen   grey: PostgreSQL baselines   orange: River v0.51.2   red outline: capped by -max-time   each panel has its own linear scale", 1, colSubtext)
	y := 68
	for _, p := range chartPanels {
		var rows []*result
		var maxRate float64
		for _, k := range p.keys {
			if r := by[k]; r != nil {
				rows = append(rows, r)
				maxRate = max(maxRate, r.Rate)
			}
		}
		if len(rows) == 0 {
			continue
		}
		drawText(img, 20, y+6, p.title, scale, colText)
		y += 30
		top := y
		// Grid lines at quarters of the panel's maximum.
		for i := 0; i <= 4; i++ {
			x := barX + barMaxW*i/4
			fill(img, x, top-4, 1, len(rows)*rowH, colGrid)
		}
		for _, r := range rows {
			drawText(img, 20, y+(rowH-7*scale)/2-2, chartLabels[r.Key], scale, colText)
			if r.Unavailable != "" || r.Rate <= 0 {
				drawText(img, barX+6, y+(rowH-7*scale)/2-2, "not available", scale, colSubtext)
				y += rowH
				continue
			}
			w := max(1, int(float64(barMaxW)*r.Rate/maxRate))
			c := colBase
			switch {
			case r.Queen:
				c = colQueen
			case r.Key == "river-insert" || r.Key == "river-drain":
				c = colRiver
			}
			fill(img, barX, y+(rowH-barH)/2-2, w, barH, c)
			if r.Capped {
				outline(img, barX, y+(rowH-barH)/2-2, w, barH, colCapped)
			}
			drawText(img, barX+w+8, y+(rowH-7*scale)/2-2, humanRate(r.Rate), scale, colText)
			y += rowH
		}
		y += panelGap
	}
	for _, r := range rs {
		if r.Offered == 0 || r.Unavailable != "" {
			continue
		}
		who := "River, worker"
		if r.Queen {
			who = "queen, Consume handler"
		}
		kept := ""
		if r.KeptUp != nil && !*r.KeptUp {
			kept = ", fell behind"
		}
		drawText(img, 20, y, fmt.Sprintf("end to end at %s msgs/s (%s): p50 %s, p99 %s%s", humanRate(r.Offered), who, fmtMs(r.P50ms), fmtMs(r.P99ms), kept), 1, colText)
		y += 14
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func humanRate(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.0fk", v/1e3)
	default:
		return fmt.Sprintf("%.0f", v)
	}
}

func fill(img *image.RGBA, x, y, w, h int, c color.Color) {
	draw.Draw(img, image.Rect(x, y, x+w, y+h), &image.Uniform{c}, image.Point{}, draw.Src)
}

func outline(img *image.RGBA, x, y, w, h int, c color.Color) {
	fill(img, x, y, w, 2, c)
	fill(img, x, y+h-2, w, 2, c)
	fill(img, x, y, 2, h, c)
	fill(img, x+w-2, y, 2, h, c)
}

// drawText draws s with its top-left corner at (x, y), each font pixel
// as an s×s square.
func drawText(img *image.RGBA, x, y int, s string, px int, c color.Color) {
	for _, r := range s {
		g, ok := glyphs[r]
		if !ok {
			g, ok = glyphs[unicode.ToUpper(r)]
		}
		if !ok {
			g = glyphs['?']
		}
		for row, line := range g {
			for col, ch := range line {
				if ch == '#' {
					fill(img, x+col*px, y+row*px, px, px, c)
				}
			}
		}
		x += 6 * px
	}
}
