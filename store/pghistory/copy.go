package pghistory

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/aovhq/aov/store"
)

// Source is a history to copy from: the embedded store (*store.DB) of a
// verifierd that kept its history in Badger before it shared this one.
type Source interface {
	AgentOwners(ctx context.Context, after string, limit int) ([]store.OwnerRecord, error)
	Verifications(ctx context.Context, agentID, cursor string, limit int) ([]store.Verification, string, error)
}

// Copied counts what CopyFrom copied, or, when it only checked, what it
// would copy.
type Copied struct {
	Owners  int // agent owners this history did not have
	Records int // verifications this history did not have
	// Conflicts counts agent ids this history gives to another owner
	// than the source does. They are never overwritten: an owner is
	// written once (owners.go).
	Conflicts int
}

// Missing reports whether the source holds anything this history lacks.
func (c Copied) Missing() bool { return c.Owners > 0 || c.Records > 0 || c.Conflicts > 0 }

// copyStep is how many owners or records one step of CopyFrom copies or
// checks: one statement or one transaction, bounded by DefaultTimeout.
// Records are read a page (store.MaxPageSize) at a time.
const copyStep = 1000

// CopyFrom copies into h every agent owner and every verification src
// holds and h does not, owners first, and counts them; with write false it
// only counts. An owner h already has is left as it is, and counted as a
// conflict when src names another; a record h already has (by id) is left
// as it is. So it can be run again, and stopped at any point: each step is
// its own transaction, and a second run copies what the first did not.
// Records are written as RecordVerification writes them, counts included.
func (h *History) CopyFrom(ctx context.Context, src Source, write bool) (Copied, error) {
	var c Copied
	for after := ""; ; {
		owners, err := src.AgentOwners(ctx, after, copyStep)
		if err != nil {
			return c, fmt.Errorf("reading the agent owners to copy: %w", err)
		}
		if len(owners) == 0 {
			break
		}
		if err := h.copyOwners(ctx, owners, write, &c); err != nil {
			return c, err
		}
		if len(owners) < copyStep {
			break
		}
		after = owners[len(owners)-1].AgentID
	}
	var step []store.Verification
	for cursor := ""; ; {
		vs, next, err := src.Verifications(ctx, "", cursor, store.MaxPageSize)
		if err != nil {
			return c, fmt.Errorf("reading the verifications to copy: %w", err)
		}
		step = append(step, vs...)
		if len(step) >= copyStep || next == "" {
			if err := h.copyRecords(ctx, step, write, &c); err != nil {
				return c, err
			}
			step = step[:0]
		}
		if next == "" {
			return c, nil
		}
		cursor = next
	}
}

// copyOwners is one step of CopyFrom over owners.
func (h *History) copyOwners(ctx context.Context, owners []store.OwnerRecord, write bool, c *Copied) error {
	ctx, cancel := context.WithTimeout(ctx, DefaultTimeout)
	defer cancel()
	agents, wallets := make([][]byte, len(owners)), make([][]byte, len(owners))
	for i, o := range owners {
		agents[i], wallets[i] = []byte(o.AgentID), []byte(o.Owner)
	}
	if write {
		tag, err := h.pool.Exec(ctx, `INSERT INTO aov_agent_owners (agent_id, owner)
			SELECT * FROM unnest($1::bytea[], $2::bytea[]) ON CONFLICT (agent_id) DO NOTHING`, agents, wallets)
		if err != nil {
			return fmt.Errorf("history: copying agent owners: %w", err)
		}
		c.Owners += int(tag.RowsAffected())
	}
	rows, err := h.pool.Query(ctx, `SELECT agent_id, owner FROM aov_agent_owners WHERE agent_id = ANY($1)`, agents)
	if err != nil {
		return fmt.Errorf("history: reading agent owners: %w", err)
	}
	have := make(map[string]string, len(owners))
	var agent, owner []byte
	_, err = pgx.ForEachRow(rows, []any{&agent, &owner}, func() error {
		have[string(agent)] = string(owner)
		return nil
	})
	if err != nil {
		return fmt.Errorf("history: reading agent owners: %w", err)
	}
	for _, o := range owners {
		switch got, ok := have[o.AgentID]; {
		case !ok:
			c.Owners++ // write false: missing
		case got != o.Owner:
			c.Conflicts++
		}
	}
	return nil
}

// copyRecords is one step of CopyFrom over records: one transaction.
func (h *History) copyRecords(ctx context.Context, vs []store.Verification, write bool, c *Copied) error {
	if len(vs) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, DefaultTimeout)
	defer cancel()
	if !write {
		ids := make([][]byte, len(vs))
		for i, v := range vs {
			ids[i] = []byte(v.ID)
		}
		var n int
		if err := h.pool.QueryRow(ctx, `SELECT count(*) FROM aov_verifications WHERE id = ANY($1)`, ids).Scan(&n); err != nil {
			return fmt.Errorf("history: reading verifications: %w", err)
		}
		c.Records += len(vs) - n
		return nil
	}
	copied := 0
	err := pgx.BeginFunc(ctx, h.pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		for _, v := range vs {
			args, err := recordArgs(v)
			if err != nil {
				return fmt.Errorf("verification %q: %w", v.ID, err)
			}
			b.Queue(record, args...).QueryRow(func(row pgx.Row) error {
				var n int
				var xid string
				err := row.Scan(&n, &xid)
				copied += n
				return err
			})
		}
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return fmt.Errorf("history: copying verifications: %w", err)
	}
	c.Records += copied
	return nil
}
