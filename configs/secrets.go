package configs

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Secrets never need to be written in the config file. Each secret value
// (redis.password, pools[].api_key, every value of tracing.headers) may
// instead be
//
//   - "${env:NAME}": the value of the environment variable NAME, or
//   - "${file:PATH}": the content of the file PATH,
//
// and redis.password and pools[].api_key have a sibling key naming a file
// (redis.password_file, pools[].api_key_file). A file's content has its
// surrounding white space (a final newline) removed. Paths are relative to
// the config file's directory, like admin.token_file.
//
// The references are only allowed in secret values: everywhere else a
// config means what it says, so that `sluice check` on another machine,
// the config's version and /debug/config describe the same settings as
// the node runs.
//
// Parse validates the references without reading them and leaves each
// referenced secret as Redacted (unknown: Compare ignores it); Load, and
// so every reload and `sluice check`, reads them (ResolveSecrets). A
// missing file, an empty one, or an unset variable is a config error at
// the position of the key that names it.

const (
	envRefPrefix  = "${env:"
	fileRefPrefix = "${file:"
)

// isSecretKey reports whether a mapping key's value is a secret: a name
// of secretKeyNames (password, api_key, token, secret, headers) or one
// ending in "_password", "_api_key" or "_secret" (a sentinel_password, a
// client_secret added later is redacted without a change here). Not
// "_token": prefill_per_token is a duration. "*_file" keys name files and
// are shown.
func isSecretKey(k string) bool {
	if secretKeyNames[k] {
		return true
	}
	for _, s := range [...]string{"_password", "_api_key", "_secret"} {
		if strings.HasSuffix(k, s) {
			return true
		}
	}
	return false
}

// secretRef splits a "${env:NAME}" or "${file:PATH}" value; ok is false
// for any other value.
func secretRef(s string) (kind, arg string, ok bool) {
	if !strings.HasSuffix(s, "}") {
		return "", "", false
	}
	switch {
	case strings.HasPrefix(s, envRefPrefix):
		return "env", s[len(envRefPrefix) : len(s)-1], true
	case strings.HasPrefix(s, fileRefPrefix):
		return "file", s[len(fileRefPrefix) : len(s)-1], true
	}
	return "", "", false
}

// looksLikeRef reports whether s is meant as a reference ("${...}"), so a
// misspelt one ("${ENV:X}", "${X}") is an error rather than a literal key.
func looksLikeRef(s string) bool { return strings.HasPrefix(s, "${") && strings.HasSuffix(s, "}") }

// secretSlot is one secret value of a config: where it is written, the
// value, and the *_file key beside it if it has one.
type secretSlot struct {
	path     string // "pools[0].api_key"
	value    string // its value in the config
	filePath string // "pools[0].api_key_file"; "" when the key has none
	file     string // that key's value
	set      func(string)
}

// secretSlots lists the config's secret values. tracing.headers is
// copied first, so that setting a header never changes a map another
// config shares.
func (c *Config) secretSlots() []secretSlot {
	r := &c.Redis
	slots := []secretSlot{{path: "redis.password", value: r.Password, filePath: "redis.password_file", file: r.PasswordFile,
		set: func(s string) { r.Password = s }},
		{path: "redis.sentinel.password", value: r.Sentinel.Password, set: func(s string) { r.Sentinel.Password = s }}}
	// The region's global store is a Redis too (region_config.go).
	g := &c.Region.GlobalStore
	slots = append(slots, secretSlot{path: "region.global_store.password", value: g.Password,
		filePath: "region.global_store.password_file", file: g.PasswordFile, set: func(s string) { g.Password = s }},
		secretSlot{path: "region.global_store.sentinel.password", value: g.Sentinel.Password,
			set: func(s string) { g.Sentinel.Password = s }})
	for i := range c.Pools {
		p := &c.Pools[i]
		slots = append(slots, secretSlot{path: fmt.Sprintf("pools[%d].api_key", i), value: p.APIKey,
			filePath: fmt.Sprintf("pools[%d].api_key_file", i), file: p.APIKeyFile, set: func(s string) { p.APIKey = s }})
	}
	if len(c.Tracing.Headers) > 0 {
		h := maps.Clone(c.Tracing.Headers)
		c.Tracing.Headers = h
		for _, k := range slices.Sorted(maps.Keys(h)) {
			slots = append(slots, secretSlot{path: "tracing.headers." + k, value: h[k], set: func(s string) { h[k] = s }})
		}
	}
	for i := range slots {
		if ref, ok := c.secretRefs[slots[i].path]; ok {
			slots[i].value = ref // hidden by Parse, still to be read
		}
	}
	return slots
}

// secrets checks the references without reading them (Parse): a value
// and a file for the same secret, an empty variable name or path, an
// unknown "${...}" form.
func (v *validator) secrets() {
	for _, s := range v.c.secretSlots() {
		if s.file != "" && s.value != "" {
			v.errorf(s.filePath, "%s: set either %s or %s, not both", s.filePath, lastKey(s.path), lastKey(s.filePath))
			continue
		}
		kind, arg, ok := secretRef(s.value)
		switch {
		case ok && strings.TrimSpace(arg) == "":
			v.errorf(s.path, "%s: %q names no %s", s.path, s.value, map[string]string{"env": "variable", "file": "file"}[kind])
		case ok && kind == "env" && !validEnvName(arg):
			v.errorf(s.path, "%s: %q is not an environment variable name", s.path, arg)
		case !ok && looksLikeRef(s.value):
			v.errorf(s.path, "%s: %q is neither ${env:NAME} nor ${file:PATH}", s.path, s.value)
		}
	}
}

func validEnvName(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		if r != '_' && (r < 'A' || r > 'Z') && (r < 'a' || r > 'z') && (i == 0 || r < '0' || r > '9') {
			return false
		}
	}
	return true
}

func lastKey(path string) string { return path[strings.LastIndexByte(path, '.')+1:] }

// referenced reports whether a secret comes from a file or a reference.
func (s secretSlot) referenced() bool {
	_, _, ok := secretRef(s.value)
	return ok || s.file != ""
}

// hideSecretRefs sets every referenced secret to Redacted: Parse has not
// read it (a config fetched from a running node names the node's files
// and variables). Compare treats Redacted as unknown, not as a change.
func (c *Config) hideSecretRefs() {
	for _, s := range c.secretSlots() {
		if !s.referenced() {
			continue
		}
		if s.file == "" {
			if c.secretRefs == nil {
				c.secretRefs = map[string]string{}
			}
			c.secretRefs[s.path] = s.value
		}
		s.set(Redacted)
	}
}

// ResolveSecrets reads every secret the config takes from a file or an
// environment variable and puts its value in the config. Load calls it
// (so every start, reload and `sluice check` reads the files again); call
// it after Parse of a local config. Errors are *Error at the key that
// names the file or variable.
func (c *Config) ResolveSecrets() error {
	var errs []error
	for _, s := range c.secretSlots() {
		if !s.referenced() {
			continue
		}
		val, path, err := c.readSecret(s)
		if err != nil {
			errs = append(errs, &Error{File: c.File, Pos: c.Pos(path), Msg: err.Error()})
			continue
		}
		s.set(val)
	}
	return errors.Join(errs...)
}

// readSecret reads one secret; path is the key an error is reported at.
func (c *Config) readSecret(s secretSlot) (val, path string, err error) {
	if s.file != "" {
		val, err = c.readSecretFile(s.filePath, s.file)
		return val, s.filePath, err
	}
	kind, arg, _ := secretRef(s.value)
	if kind == "file" {
		val, err = c.readSecretFile(s.path, arg)
		return val, s.path, err
	}
	v, ok := os.LookupEnv(arg)
	if !ok {
		return "", s.path, fmt.Errorf("%s: environment variable %s is not set", s.path, arg)
	}
	val, err = checkSecret(v)
	if err != nil {
		return "", s.path, fmt.Errorf("%s: environment variable %s %v", s.path, arg, err)
	}
	return val, s.path, nil
}

// MaxSecretBytes bounds a secret file: a path pointing at a device or a
// log by mistake fails fast instead of filling memory.
const MaxSecretBytes = 64 << 10

// readSecretFile reads a secret file (relative to the config's
// directory), surrounding white space removed.
func (c *Config) readSecretFile(key, name string) (string, error) {
	path := c.relPath(name)
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("%s: %v", key, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxSecretBytes+1))
	switch {
	case err != nil:
		return "", fmt.Errorf("%s: %s: %v", key, path, err)
	case len(data) > MaxSecretBytes:
		return "", fmt.Errorf("%s: %s is larger than %d bytes", key, path, MaxSecretBytes)
	}
	v, err := checkSecret(string(data))
	if err != nil {
		return "", fmt.Errorf("%s: %s %v", key, path, err)
	}
	return v, nil
}

// checkSecret trims a secret read from a file or variable and refuses an
// empty one, or one with a control character inside (a line break would
// end the Authorization header a pool's key is sent in). The value is
// never quoted in the error.
func checkSecret(v string) (string, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return "", errors.New("holds no secret")
	}
	for _, r := range v {
		if r < 0x20 || r == 0x7f {
			return "", errors.New("holds a control character (a line break?) inside the secret")
		}
	}
	return v, nil
}

// relPath resolves a file named in the config against its directory.
func (c *Config) relPath(f string) string {
	if f == "" || filepath.IsAbs(f) || c.File == DefaultName {
		return f
	}
	return filepath.Join(filepath.Dir(c.File), f)
}
