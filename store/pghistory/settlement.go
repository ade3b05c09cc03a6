package pghistory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

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
	if payment != store.PaymentPaid && payment != store.PaymentUnpaid {
		return fmt.Errorf("history: a settlement outcome is paid or unpaid, not %q", payment)
	}
	return pgx.BeginFunc(ctx, h.pool, func(tx pgx.Tx) error {
		var b []byte
		err := tx.QueryRow(ctx, `SELECT record FROM aov_verifications WHERE id = $1 FOR UPDATE`, []byte(id)).Scan(&b)
		if errors.Is(err, pgx.ErrNoRows) {
			return store.ErrNotFound
		}
		if err != nil {
			return fmt.Errorf("history: reading verification: %w", err)
		}
		var v store.Verification
		if err := json.Unmarshal(b, &v); err != nil {
			return fmt.Errorf("history: decoding verification: %w", err)
		}
		if v.Payment != store.PaymentPending {
			return store.ErrPaymentFinal
		}
		v.Payment = payment
		val, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("history: encoding verification: %w", err)
		}
		if _, err := tx.Exec(ctx, `UPDATE aov_verifications SET record = $2 WHERE id = $1`, []byte(id), val); err != nil {
			return fmt.Errorf("history: updating verification: %w", err)
		}
		var one store.Counts
		one.Add(v)
		if v.AgentID == "" || one == (store.Counts{}) {
			return nil
		}
		_, err = tx.Exec(ctx, `UPDATE aov_agent_counts SET
			pass = pass + $2, fail = fail + $3, auth_pass = auth_pass + $4, auth_fail = auth_fail + $5, paid = paid + $6
			WHERE agent_id = $1`, []byte(v.AgentID), one.Pass, one.Fail, one.AuthenticatedPass, one.AuthenticatedFail, one.Paid)
		if err != nil {
			return fmt.Errorf("history: counting verification: %w", err)
		}
		return nil
	})
}
