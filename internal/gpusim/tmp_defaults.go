package gpusim

// WithDefaults is a placeholder until the simulator lands.
func (c Config) WithDefaults() Config { return c }

// Validate is a placeholder until the simulator lands.
func (c Config) Validate() error { return nil }
