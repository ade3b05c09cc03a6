package pghistory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/aovhq/aov/store"
)

// SetPayment records the outcome of a pending verification's settlement,
// as the embedded store does: paid (it now counts toward its agent's
// counts) or unpaid (it never will). A record that is not pending is left
// as it is (store.ErrPaymentFinal), so a late or repeated report from any
// instance cannot change history; the row lock makes two concurrent reports
// count once.
func (h *History) SetPayment(ctx context.Context, id, payment string) error {
	errs, err := h.SetPayments(ctx, []store.PaymentOutcome{{ID: id, Payment: payment}})
	if err != nil {
		return err
	}
	return errs[0]
}

// SetPayments records outcomes as SetPayment records each, one after
// another, in one transaction, as the embedded store does: errs[i] is
// outcome i's own refusal (store.ErrNotFound, store.ErrPaymentFinal, or a
// payment that is neither paid nor unpaid), err a failure of the
// transaction, which records none of them.
//
// Rows are locked in one order whatever the batch's: the verification rows
// by id, then the agents' counts by agent id, so two batches from two
// instances never wait on each other in a cycle (which PostgreSQL would
// break by failing one of them).
func (h *History) SetPayments(ctx context.Context, outs []store.PaymentOutcome) (errs []error, err error) {
	order := make([]int, len(outs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return strings.Compare(outs[a].ID, outs[b].ID) })
	err = pgx.BeginFunc(ctx, h.pool, func(tx pgx.Tx) error {
		errs = make([]error, len(outs))
		counts := map[string]*store.Counts{}
		for _, i := range order {
			v, err := setPayment(ctx, tx, outs[i])
			if err != nil {
				if !store.OutcomeRefused(err) {
					return err
				}
				errs[i] = err
				continue
			}
			if v.AgentID == "" || !v.Counted() {
				continue
			}
			c := counts[v.AgentID]
			if c == nil {
				c = new(store.Counts)
				counts[v.AgentID] = c
			}
			c.Add(v)
		}
		for _, agent := range slices.Sorted(maps.Keys(counts)) {
			// An upsert: a pending record did not count when it was
			// made, so its agent may have no counts yet; and a record
			// that counts from now on moves first and last.
			c := counts[agent]
			_, err := tx.Exec(ctx, `INSERT INTO aov_agent_counts AS c (agent_id, pass, fail, auth_pass, auth_fail, paid, first_ns, last_ns)
				VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
				ON CONFLICT (agent_id) DO UPDATE SET
				pass = c.pass + EXCLUDED.pass, fail = c.fail + EXCLUDED.fail,
				auth_pass = c.auth_pass + EXCLUDED.auth_pass, auth_fail = c.auth_fail + EXCLUDED.auth_fail,
				paid = c.paid + EXCLUDED.paid,
				first_ns = LEAST(c.first_ns, EXCLUDED.first_ns), last_ns = GREATEST(c.last_ns, EXCLUDED.last_ns)`,
				[]byte(agent), c.Pass, c.Fail, c.AuthenticatedPass, c.AuthenticatedFail, c.Paid, c.First.UnixNano(), c.Last.UnixNano())
			if err != nil {
				return fmt.Errorf("history: counting verification: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return errs, nil
}

// setPayment sets o's record in tx and returns it as it now stands, or
// refuses o having written nothing.
func setPayment(ctx context.Context, tx pgx.Tx, o store.PaymentOutcome) (store.Verification, error) {
	var v store.Verification
	if err := o.Check(); err != nil {
		return v, err
	}
	var b []byte
	err := tx.QueryRow(ctx, `SELECT record FROM aov_verifications WHERE id = $1 FOR UPDATE`, []byte(o.ID)).Scan(&b)
	if errors.Is(err, pgx.ErrNoRows) {
		return v, store.ErrNotFound
	}
	if err != nil {
		return v, fmt.Errorf("history: reading verification: %w", err)
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return v, fmt.Errorf("history: decoding verification: %w", err)
	}
	if v.Payment != store.PaymentPending {
		return v, store.ErrPaymentFinal
	}
	v.Payment = o.Payment
	val, err := json.Marshal(v)
	if err != nil {
		return v, fmt.Errorf("history: encoding verification: %w", err)
	}
	if _, err := tx.Exec(ctx, `UPDATE aov_verifications SET record = $2 WHERE id = $1`, []byte(o.ID), val); err != nil {
		return v, fmt.Errorf("history: updating verification: %w", err)
	}
	return v, nil
}
