package pghistory

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

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
	// than the source does (store.SameWallet). They are never
	// overwritten: an owner is written once (owners.go). A bare Solana
	// address the source binds to another wallet is one unless this
	// history holds that binding (takesAccount): with no row it is its
	// key holder's account here.
	Conflicts int
	// ConflictIDs names the first MaxConflictIDs of them, in the
	// source's order, so that the operator can resolve them.
	ConflictIDs []string
	// Skipped counts the source's records of those agent ids, which are
	// not copied: they are the history of another owner than this
	// history's, and would count as its (authenticated ones too).
	Skipped int
}

// MaxConflictIDs bounds Copied.ConflictIDs.
const MaxConflictIDs = 10

// Missing reports whether the source holds anything this history lacks.
func (c Copied) Missing() bool { return c.Owners > 0 || c.Records > 0 || c.Conflicts > 0 }

// copyStep is how many owners or records one step of CopyFrom copies or
// checks: one statement or one transaction, bounded by DefaultTimeout.
// Records are read a page (store.MaxPageSize) at a time.
const copyStep = 1000

// stepAttempts bounds how often a step PostgreSQL failed to break a lock
// cycle, or as a serialization failure, is run (retryStep).
const stepAttempts = 5

// CopyFrom copies into h every agent owner and every verification src
// holds and h does not, owners first, and counts them; with write false it
// only counts. An owner h already has is left as it is, and counted as a
// conflict when src names another, as is src's binding of a bare Solana
// address to another wallet that h does not hold (takesAccount); a record h already has (by id) is left
// as it is. So it can be run again, and stopped at any point: each step is
// its own transaction, and a second run copies what the first did not.
// Records are written as RecordVerification writes them, counts included,
// except those of an agent id in conflict (Copied.Skipped).
func (h *History) CopyFrom(ctx context.Context, src Source, write bool) (Copied, error) {
	var c Copied
	// Every conflicting id, so that none of its records is copied;
	// conflicts are rare (an id bound on two histories).
	conflicted := map[string]bool{}
	for after := ""; ; {
		owners, err := src.AgentOwners(ctx, after, copyStep)
		if err != nil {
			return c, fmt.Errorf("reading the agent owners to copy: %w", err)
		}
		if len(owners) == 0 {
			break
		}
		if err := h.copyOwners(ctx, owners, write, &c, conflicted); err != nil {
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
		for _, v := range vs {
			if v.AgentID != "" && conflicted[v.AgentID] {
				c.Skipped++
				continue
			}
			step = append(step, v)
		}
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

// copyOwners is one step of CopyFrom over owners: it adds the ids in
// conflict to conflicted.
func (h *History) copyOwners(ctx context.Context, owners []store.OwnerRecord, write bool, c *Copied, conflicted map[string]bool) error {
	agents := make([][]byte, len(owners))
	insAgents, insWallets := make([][]byte, 0, len(owners)), make([][]byte, 0, len(owners))
	for i, o := range owners {
		agents[i] = []byte(o.AgentID)
		if !takesAccount(o) {
			insAgents, insWallets = append(insAgents, agents[i]), append(insWallets, []byte(o.Owner))
		}
	}
	have := make(map[string]string, len(owners))
	copied := 0
	err := retryStep(ctx, func(ctx context.Context) error {
		copied = 0
		clear(have)
		if write {
			tag, err := h.pool.Exec(ctx, `INSERT INTO aov_agent_owners (agent_id, owner)
				SELECT * FROM unnest($1::bytea[], $2::bytea[]) ON CONFLICT (agent_id) DO NOTHING`, insAgents, insWallets)
			if err != nil {
				return fmt.Errorf("history: copying agent owners: %w", err)
			}
			copied = int(tag.RowsAffected())
		}
		rows, err := h.pool.Query(ctx, `SELECT agent_id, owner FROM aov_agent_owners WHERE agent_id = ANY($1)`, agents)
		if err != nil {
			return fmt.Errorf("history: reading agent owners: %w", err)
		}
		var agent, owner []byte
		_, err = pgx.ForEachRow(rows, []any{&agent, &owner}, func() error {
			have[string(agent)] = string(owner)
			return nil
		})
		if err != nil {
			return fmt.Errorf("history: reading agent owners: %w", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	c.Owners += copied
	for _, o := range owners {
		switch got, ok := have[o.AgentID]; {
		case ok && store.SameWallet(got, o.Owner):
		case !ok && !takesAccount(o):
			c.Owners++ // write false: missing
		default:
			c.Conflicts++
			conflicted[o.AgentID] = true
			if len(c.ConflictIDs) < MaxConflictIDs {
				c.ConflictIDs = append(c.ConflictIDs, o.AgentID)
			}
		}
	}
	return nil
}

// takesAccount reports whether o binds a bare Solana address a wallet
// proof can carry (store.SolanaWalletKey) to another wallet than that
// address: a binding made before bare Solana addresses were accounts. Here
// such an address with no owner row is its key holder's account, whose
// authenticated records count, and no new binding of one is made (SPEC
// §9), so copying o would take the address from its key holder: it is a
// conflict unless this history already holds the same binding.
func takesAccount(o store.OwnerRecord) bool {
	_, ok := store.SolanaWalletKey(o.AgentID)
	return ok && !store.SameWallet(o.Owner, o.AgentID)
}

// copyRecords is one step of CopyFrom over records: one transaction. It
// inserts them in lockOrder, so that it never waits in a cycle with
// another step (of a copy from another -data, say) or with SetPayments.
func (h *History) copyRecords(ctx context.Context, vs []store.Verification, write bool, c *Copied) error {
	if len(vs) == 0 {
		return nil
	}
	if !write {
		ids := make([][]byte, len(vs))
		for i, v := range vs {
			ids[i] = []byte(v.ID)
		}
		var n int
		err := retryStep(ctx, func(ctx context.Context) error {
			return h.pool.QueryRow(ctx, `SELECT count(*) FROM aov_verifications WHERE id = ANY($1)`, ids).Scan(&n)
		})
		if err != nil {
			return fmt.Errorf("history: reading verifications: %w", err)
		}
		c.Records += len(vs) - n
		return nil
	}
	slices.SortFunc(vs, lockOrder)
	args := make([][]any, len(vs))
	for i, v := range vs {
		var err error
		if args[i], err = recordArgs(v); err != nil {
			return fmt.Errorf("history: copying verification %q: %w", v.ID, err)
		}
	}
	copied := 0
	err := retryStep(ctx, func(ctx context.Context) error {
		copied = 0
		return pgx.BeginFunc(ctx, h.pool, func(tx pgx.Tx) error {
			b := &pgx.Batch{}
			for _, a := range args {
				b.Queue(record, a...).QueryRow(func(row pgx.Row) error {
					var n int
					var xid string
					err := row.Scan(&n, &xid)
					copied += n
					return err
				})
			}
			return tx.SendBatch(ctx, b).Close()
		})
	})
	if err != nil {
		return fmt.Errorf("history: copying verifications: %w", err)
	}
	c.Records += copied
	return nil
}

// lockOrder is the order in which a transaction that records several
// verifications locks rows: by agent id, which orders the agents' counts
// rows as SetPayments locks them (it sorts its agents the same way), then
// by id. Two such transactions, or one and a SetPayments, then never hold
// a row the other waits for while waiting for one the other holds.
func lockOrder(a, b store.Verification) int {
	return cmp.Or(strings.Compare(a.AgentID, b.AgentID), strings.Compare(a.ID, b.ID))
}

// retryStep runs step, each attempt bounded by DefaultTimeout, again when
// PostgreSQL failed it to break a lock cycle (40P01) or as a
// serialization failure (40001), up to stepAttempts times: such a failure
// rolled the step back whole, and a live instance's transaction, which a
// copy must not make fail, may be the other side. The last error is
// returned.
func retryStep(ctx context.Context, step func(context.Context) error) error {
	for attempt := 1; ; attempt++ {
		sctx, cancel := context.WithTimeout(ctx, DefaultTimeout)
		err := step(sctx)
		cancel()
		pgErr, ok := errors.AsType[*pgconn.PgError](err)
		if err == nil || !ok || (pgErr.Code != "40P01" && pgErr.Code != "40001") || attempt == stepAttempts {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(attempt) * 50 * time.Millisecond):
		}
	}
}
