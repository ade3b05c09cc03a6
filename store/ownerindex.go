package store

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/dgraph-io/badger/v4"
)

// # The authenticated index
//
// A score of an agent id with an owner counts only the verifications its
// owner authenticated, and anyone can record any number of
// unauthenticated labels under any id. Reading the agent's whole history
// to find the owner's records would let those labels make every score of
// the id slow, so each authenticated record is also kept under its own key
// family, and a score reads only that:
//
//	'u' len agent inv(at) id               → Verification (record.go); one agent's authenticated, newest first
//
// The index holds every authenticated record (pending, unpaid and test
// ones too: Counted and the score decide, as they do for the agent's full
// history), and its copy changes in the same transaction as the others
// (putAgentRecord). An attacker cannot grow it under someone else's id:
// verifierd marks a record authenticated only for the wallet that owns the
// id (an account id's address, or its first binder), and refuses a proof
// from any other wallet before anything is recorded.

func authenticatedPrefix(agent string) []byte {
	k := make([]byte, 0, 3+len(agent)+8+36)
	k = append(k, tagAuthenticated)
	return appendComponent(k, agent)
}

// putAuthenticatedRecord writes the index copy of v (encoded as val) when v
// is authenticated; putAgentRecord calls it for every record it writes.
func putAuthenticatedRecord(txn *tx, v Verification, val []byte) error {
	if !v.Authenticated || v.AgentID == "" {
		return nil
	}
	k := binary.BigEndian.AppendUint64(authenticatedPrefix(v.AgentID), invTime(v.VerifiedAt))
	return txn.Set(append(k, v.ID...), val)
}

// AuthenticatedVerifications pages through agentID's authenticated
// verifications newest first, exactly like Verifications pages through all
// of them (the same order, limits and cursor rules; a cursor of one is not
// a cursor of the other). It reads nothing else of the agent's history, so
// its cost grows with the authenticated records only.
func (db *DB) AuthenticatedVerifications(ctx context.Context, agentID, cursor string, limit int) ([]Verification, string, error) {
	if limit <= 0 {
		limit = DefaultPageSize
	}
	limit = min(limit, MaxPageSize)
	after, err := parseCursor(cursor)
	if err != nil {
		return nil, "", err
	}
	if agentID == "" || len(agentID) > MaxAgentIDBytes {
		return nil, "", nil
	}
	prefix := authenticatedPrefix(agentID)
	out := make([]Verification, 0, min(limit, 16))
	var next string
	err = db.view(ctx, func(txn *tx) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, PrefetchValues: true, PrefetchSize: limit + 1})
		defer it.Close()
		var lastSuffix []byte
		for it.Seek(append(bytes.Clone(prefix), after...)); it.ValidForPrefix(prefix); it.Next() {
			suffix := it.Item().Key()[len(prefix):]
			if after != nil && bytes.Equal(suffix, after) {
				continue
			}
			if len(out) == limit {
				next = base64.RawURLEncoding.EncodeToString(lastSuffix)
				return nil
			}
			var v Verification
			if err := it.Item().Value(func(b []byte) error { return decodeRecord(b, &v) }); err != nil {
				return fmt.Errorf("decoding verification: %w", err)
			}
			out = append(out, v)
			lastSuffix = append(lastSuffix[:0], suffix...)
		}
		return nil
	})
	if err != nil {
		return nil, "", err
	}
	return out, next, nil
}

// parseCursor decodes a paging cursor of Verifications or
// AuthenticatedVerifications (nil for ""): the key suffix of the last
// record served, in strict unpadded URL-safe base64 without \r or \n
// (which the decoder would skip), so a cursor has one spelling.
func parseCursor(cursor string) ([]byte, error) {
	if cursor == "" {
		return nil, nil
	}
	after, err := base64.RawURLEncoding.Strict().DecodeString(cursor)
	if err != nil || strings.ContainsAny(cursor, "\r\n") || len(after) < 9 {
		return nil, ErrBadCursor
	}
	return after, nil
}

// migrateLayout brings a database of layout version from up to
// layoutVersion, and writes the new version last: a migration cut short by
// a crash is run again on the next open (its writes are idempotent), and a
// database is never marked migrated before it is.
//
// From 1 it builds the authenticated index from the agents' records. From
// 2 there is nothing to rewrite: version 3 adds the binary form of a
// record (record.go), and the JSON records already stored read as they
// are; the version is raised so that an older build, which reads only
// JSON records, refuses the database instead of misreading it. From 3
// likewise: version 4 adds claim refs (claims.go), and claims with their
// note under every key read as they are.
func (db *DB) migrateLayout(from byte) error {
	if from < 1 || from >= layoutVersion {
		return fmt.Errorf("store in %s has key layout version %d; this build reads version %d", db.dir, from, layoutVersion)
	}
	indexed := 0
	if from == 1 {
		var err error
		if indexed, err = db.buildAuthenticatedIndex(); err != nil {
			return fmt.Errorf("store in %s: building the authenticated index (layout 1 to %d): %w", db.dir, layoutVersion, err)
		}
	}
	err := db.update(context.Background(), func(txn *tx) error {
		return txn.Set(keyLayoutVersion, []byte{layoutVersion})
	})
	if err == nil && db.opts.Logger != nil {
		db.opts.Logger.Info("store: migrated the key layout", "dir", db.dir, "from", from, "to", layoutVersion, "authenticated_records_indexed", indexed)
	}
	return err
}

// buildAuthenticatedIndex writes the 'u' copy of every authenticated
// record under an agent (one read, written through the committer in
// bounded chunks, so through the write-ahead log like any write) and
// reports how many it wrote.
func (db *DB) buildAuthenticatedIndex() (int, error) {
	type entry struct{ key, val []byte }
	var chunk []entry
	write := func() error {
		err := db.update(context.Background(), func(txn *tx) error {
			for _, e := range chunk {
				if err := txn.Set(e.key, e.val); err != nil {
					return err
				}
			}
			return nil
		})
		chunk = chunk[:0]
		return err
	}
	indexed := 0
	err := db.view(context.Background(), func(txn *tx) error {
		prefix := []byte{tagAgent}
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, PrefetchValues: true, PrefetchSize: 100})
		defer it.Close()
		for it.Rewind(); it.ValidForPrefix(prefix); it.Next() {
			val, err := it.Item().ValueCopy(nil)
			if err != nil {
				return err
			}
			var v Verification
			if err := decodeRecord(val, &v); err != nil {
				return fmt.Errorf("decoding verification: %w", err)
			}
			if !v.Authenticated || v.AgentID == "" {
				continue
			}
			k := binary.BigEndian.AppendUint64(authenticatedPrefix(v.AgentID), invTime(v.VerifiedAt))
			chunk = append(chunk, entry{append(k, v.ID...), val})
			indexed++
			if len(chunk) == migrationChunk {
				if err := write(); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err == nil && len(chunk) > 0 {
		err = write()
	}
	return indexed, err
}

// migrationChunk bounds the index entries one migration write holds:
// well inside one transaction and one log record.
const migrationChunk = 256
