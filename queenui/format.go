package queenui

import (
	"fmt"
	"html/template"
	"time"
)

var funcs = template.FuncMap{
	"dur":   dur,
	"ago":   func(t time.Time) string { return ago(time.Now(), t) },
	"until": func(t time.Time) string { return dur(time.Until(t)) },
	"rate":  rate,
	"bytes": byteSize,
	"group": groupName,
}

// dur renders a duration to two units at most ("3m4s", "1h2m"), "0s"
// for none.
func dur(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	case d < 48*time.Hour:
		return d.Round(time.Minute).String()
	default:
		return fmt.Sprintf("%dd%dh", d/(24*time.Hour), d%(24*time.Hour)/time.Hour)
	}
}

func ago(now, t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return dur(now.Sub(t)) + " ago"
}

func rate(r float64) string {
	switch {
	case r < 0:
		return "–"
	case r == 0:
		return "0/s"
	case r < 10:
		return fmt.Sprintf("%.1f/s", r)
	default:
		return fmt.Sprintf("%.0f/s", r)
	}
}

func byteSize(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// groupName shows queue mode, whose name is "", as such.
func groupName(g string) string {
	if g == "" {
		return "(queue mode)"
	}
	return g
}
