// Package examplebuild holds only a test: that every program under examples/
// builds when copied into a module of its own, as a reader would copy it.
package examplebuild
