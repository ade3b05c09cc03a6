package store

import "syscall"

// walOpenFlags opens the write-ahead log O_DSYNC: each write returns once
// its data is on disk, without the separate fdatasync call (one system
// call, and measurably less CPU, per commit).
const walOpenFlags = syscall.O_DSYNC

// walDirectFlag is added for the descriptor records are written with.
const walDirectFlag = syscall.O_DIRECT
