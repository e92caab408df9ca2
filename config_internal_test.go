package queen

import (
	"testing"
	"time"
)

// A zero FusionConfig field takes its QUEEN_FUSION_* variable, else its
// exported default; a set field wins over both.
func TestFusionDefaultsAndEnv(t *testing.T) {
	base := Config{DatabaseURL: "postgres://localhost/x"}
	c, err := base.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if f := c.Fusion; f.Shards != DefaultFusionShards || f.BundleMax != DefaultBundleMax || f.BundleBase != DefaultBundleBase || f.Hold != DefaultFusionHold {
		t.Fatalf("defaults: %+v", f)
	}
	t.Setenv("QUEEN_FUSION_SHARDS", "3")
	t.Setenv("QUEEN_FUSION_BUNDLE_MAX", "64")
	t.Setenv("QUEEN_FUSION_BUNDLE_BASE", "4")
	t.Setenv("QUEEN_FUSION_HOLD_MS", "7")
	if c, err = base.withDefaults(); err != nil {
		t.Fatal(err)
	}
	if f := c.Fusion; f.Shards != 3 || f.BundleMax != 64 || f.BundleBase != 4 || f.Hold != 7*time.Millisecond {
		t.Fatalf("from the environment: %+v", f)
	}
	set := base
	set.Fusion.Shards = 5
	if c, err = set.withDefaults(); err != nil || c.Fusion.Shards != 5 {
		t.Fatalf("a set field: %d, %v", c.Fusion.Shards, err)
	}
}
