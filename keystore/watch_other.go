//go:build !linux

package keystore

import "errors"

// Without inotify every Refresh stats the index.

func openWatch(string, []step) (int, []int32, error) {
	return -1, nil, errors.New("watching a directory is implemented on Linux only")
}

func pollWatch(int, map[int32]string) (events bool, state watchState) { return true, watchEnded }

func closeWatch(int) {}
