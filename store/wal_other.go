//go:build !linux

package store

// walOpenFlags is empty where O_DSYNC is not relied on: each write to the
// write-ahead log is followed by an fsync instead.
const walOpenFlags = 0

// walDirectFlag is empty: records are written without O_DIRECT.
const walDirectFlag = 0
