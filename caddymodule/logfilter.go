package caddymodule

import (
	"bytes"
	"encoding/json"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/logging"
	"go.uber.org/zap"
	"go.uber.org/zap/buffer"
	"go.uber.org/zap/zapcore"
)

func init() {
	caddy.RegisterModule(LogFilter{})
}

// LogFilter is the log format aov_filter: Caddy's filter encoder (the same
// configuration: wrap, fields), except that the fields a logger is given
// with With are kept as they are and encoded only when a line is written.
//
// Caddy hands every core of a logger the fields given to With, whether or
// not that core will ever write a line of that logger: each request's copy
// reaches Caddy's own log (which excludes access lines) through the access
// logger, and reverse_proxy gives its upstream request to its logger on
// every call for lines it writes only at DEBUG. Caddy's filter encodes them
// at once, each of the request's fields through the filter, which cost the
// gateway about 40 allocations per call for lines never written. What a
// written line holds, and what the filter deletes from it, is unchanged:
// the kept fields are given to Caddy's filter with the line's own, in
// order. A kept field is read when its line is written: what Caddy gives
// With is a request it no longer changes (each request's copy, taken
// before any handler runs; the request reverse_proxy has sent).
type LogFilter struct {
	filter logging.FilterEncoder
	// with are the fields given to With, in order, not yet encoded. A
	// clone shares the array up to its own length, and appending never
	// writes into it (see Clone).
	with []zapcore.Field
}

// CaddyModule returns the Caddy module information.
func (LogFilter) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "caddy.logging.encoders.aov_filter",
		New: func() caddy.Module { return new(LogFilter) },
	}
}

// The configuration is Caddy's filter's, field for field, refused as
// Caddy refuses a module's unknown field: a misspelt "fields" would
// otherwise load and delete nothing.
func (e *LogFilter) UnmarshalJSON(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(&e.filter)
}

// MarshalJSON writes the configuration as Caddy's filter writes its own.
func (e LogFilter) MarshalJSON() ([]byte, error) { return json.Marshal(e.filter) }

// UnmarshalCaddyfile reads the filter's Caddyfile syntax.
func (e *LogFilter) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return e.filter.UnmarshalCaddyfile(d)
}

// Provision sets up the filter and the encoder it wraps.
func (e *LogFilter) Provision(ctx caddy.Context) error { return e.filter.Provision(ctx) }

// ConfigureDefaultFormat lets the filter choose its default wrapped encoder.
func (e *LogFilter) ConfigureDefaultFormat(wo caddy.WriterOpener) error {
	return e.filter.ConfigureDefaultFormat(wo)
}

// Clone is called once per With: the copy gets room for a few fields in
// one allocation, so it never appends into an array its original shares.
func (e *LogFilter) Clone() zapcore.Encoder {
	c := &LogFilter{filter: e.filter, with: make([]zapcore.Field, len(e.with), len(e.with)+4)}
	copy(c.with, e.with)
	return c
}

// EncodeEntry writes a line: the kept fields, then the line's own, all
// through the filter, as if the kept ones had been encoded at With.
func (e *LogFilter) EncodeEntry(ent zapcore.Entry, fields []zapcore.Field) (*buffer.Buffer, error) {
	if len(e.with) > 0 {
		fields = append(e.with[:len(e.with):len(e.with)], fields...)
	}
	return e.filter.EncodeEntry(ent, fields)
}

func (e *LogFilter) keep(f zapcore.Field) { e.with = append(e.with, f) }

// The ObjectEncoder methods are what With calls on a clone, one per field
// (an inline object's members, an error's message and causes, a
// Stringer's string arrive already split, as zap splits them): each is
// kept as the field that encodes the same.

func (e *LogFilter) AddArray(k string, v zapcore.ArrayMarshaler) error {
	e.keep(zap.Array(k, v))
	return nil
}

func (e *LogFilter) AddObject(k string, v zapcore.ObjectMarshaler) error {
	e.keep(zap.Object(k, v))
	return nil
}

func (e *LogFilter) AddBinary(k string, v []byte)          { e.keep(zap.Binary(k, v)) }
func (e *LogFilter) AddByteString(k string, v []byte)      { e.keep(zap.ByteString(k, v)) }
func (e *LogFilter) AddBool(k string, v bool)              { e.keep(zap.Bool(k, v)) }
func (e *LogFilter) AddComplex128(k string, v complex128)  { e.keep(zap.Complex128(k, v)) }
func (e *LogFilter) AddComplex64(k string, v complex64)    { e.keep(zap.Complex64(k, v)) }
func (e *LogFilter) AddDuration(k string, v time.Duration) { e.keep(zap.Duration(k, v)) }
func (e *LogFilter) AddFloat64(k string, v float64)        { e.keep(zap.Float64(k, v)) }
func (e *LogFilter) AddFloat32(k string, v float32)        { e.keep(zap.Float32(k, v)) }
func (e *LogFilter) AddInt(k string, v int)                { e.keep(zap.Int(k, v)) }
func (e *LogFilter) AddInt64(k string, v int64)            { e.keep(zap.Int64(k, v)) }
func (e *LogFilter) AddInt32(k string, v int32)            { e.keep(zap.Int32(k, v)) }
func (e *LogFilter) AddInt16(k string, v int16)            { e.keep(zap.Int16(k, v)) }
func (e *LogFilter) AddInt8(k string, v int8)              { e.keep(zap.Int8(k, v)) }
func (e *LogFilter) AddString(k, v string)                 { e.keep(zap.String(k, v)) }
func (e *LogFilter) AddTime(k string, v time.Time)         { e.keep(zap.Time(k, v)) }
func (e *LogFilter) AddUint(k string, v uint)              { e.keep(zap.Uint(k, v)) }
func (e *LogFilter) AddUint64(k string, v uint64)          { e.keep(zap.Uint64(k, v)) }
func (e *LogFilter) AddUint32(k string, v uint32)          { e.keep(zap.Uint32(k, v)) }
func (e *LogFilter) AddUint16(k string, v uint16)          { e.keep(zap.Uint16(k, v)) }
func (e *LogFilter) AddUint8(k string, v uint8)            { e.keep(zap.Uint8(k, v)) }
func (e *LogFilter) AddUintptr(k string, v uintptr)        { e.keep(zap.Uintptr(k, v)) }
func (e *LogFilter) OpenNamespace(k string)                { e.keep(zap.Namespace(k)) }

func (e *LogFilter) AddReflected(k string, v any) error {
	e.keep(zap.Reflect(k, v))
	return nil
}

// Interface guards
var (
	_ zapcore.Encoder                  = (*LogFilter)(nil)
	_ caddy.Provisioner                = (*LogFilter)(nil)
	_ caddyfile.Unmarshaler            = (*LogFilter)(nil)
	_ caddy.ConfiguresFormatterDefault = (*LogFilter)(nil)
)
