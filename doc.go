// Package queen is an embeddable, PostgreSQL-backed, partitioned message log.
package queen
