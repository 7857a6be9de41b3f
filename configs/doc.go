// Package configs holds Sluice's YAML configuration: the schema, defaults,
// validation with file:line:col errors, the embedded default configuration
// and the example configurations.
package configs
