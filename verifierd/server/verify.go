package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/internal/growread"
	"github.com/aovhq/aov/receipt"
	"github.com/aovhq/aov/signer"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/verify"
)

// Every agent_id a request may carry (verify.MaxIDChars characters of up
// to utf8.UTFMax bytes) is one every history store records and binds
// (store.MaxAgentIDBytes): this stops compiling if either limit moves past
// the other, rather than letting a valid request fail at its record.
const _ = uint(store.MaxAgentIDBytes - verify.MaxIDChars*utf8.UTFMax)

// A bound agent id (store.BindableAgentID) has the length limit of the
// agent_id a request carries, so any agent that can be verified can be
// bound: this stops compiling if the two limits part.
const _ = uint(store.MaxAgentIDChars-verify.MaxIDChars) + uint(verify.MaxIDChars-store.MaxAgentIDChars)

// serveVerify is POST /verify/schema and POST /verify/deliverable: one
// check under two names, signed under the same context. The MCP tool
// verify_schema is the same check again (verifyRequest).
//
// Order matters: parse (refusals cost nothing), check, sign, record, answer.
// Nothing is recorded unless it was signed, and nothing signed is sent
// unless it was recorded: the history is what reputation and scores are
// computed from, so every receipt in circulation must be in it. A record
// failure therefore answers 503 (retryable, nothing charged, since the
// gateway settles only successful answers) and the signed receipt is
// discarded; the caller's retry gets a fresh verification.
//
// The body and the response are pooled buffers: nothing keeps a reference
// to either once the answer is written (the parsed request copies what it
// keeps, and a ResponseWriter copies what it is given).
func (s *Server) serveVerify(w http.ResponseWriter, r *http.Request, rec *requestLog) error {
	bodyBuf := getBuffer()
	body, err := s.readBody(w, r, *bodyBuf)
	defer func() { putBuffer(bodyBuf, body) }()
	if err != nil {
		return err
	}
	gw := s.gatewayInfo(r.Header, r.RemoteAddr)
	docBuf := getBuffer()
	doc, err := s.verifyRequest(r.Context(), body, gw, rec, *docBuf)
	if err != nil {
		putBuffer(docBuf, *docBuf)
		return err
	}
	askSettlementReport(w, rec.payment)
	writeDoc(w, r, doc)
	putBuffer(docBuf, doc)
	return nil
}

// verifyRequest is one verification, whichever way it arrived (a REST body
// or the arguments of the MCP tool verify_schema): parse, check, sign,
// record. It returns the signed response document, appended to dst[:0], or
// an *apierr.Error.
func (s *Server) verifyRequest(ctx context.Context, body []byte, gw gatewayInfo, rec *requestLog, dst []byte) ([]byte, error) {
	req, err := s.v.ParseContext(ctx, body)
	if err != nil {
		return nil, err
	}
	agentID := ""
	if req.AgentID != nil {
		agentID = *req.AgentID
	}
	// The owner store is bounded like the record (storeBy): a stalled one
	// is a 503, nothing signed or recorded, not a request held for as
	// long as it is stalled.
	actx, cancel := context.WithDeadline(ctx, gw.storeBy(time.Now()))
	authenticated, err := s.authenticate(actx, agentID, gw) // gateway.go: who owns an agent_id
	cancel()
	if err != nil {
		return nil, err
	}
	id, err := s.newID()
	if err != nil {
		return nil, apierr.Internal(err)
	}
	if gw.tooLate(time.Now()) {
		return nil, errGatewayGaveUp()
	}
	at := s.now().UTC().Truncate(time.Microsecond)
	res := s.v.Check(req, id, at)
	rec.verificationID = id

	// The result writes its canonical form itself, so signing does not
	// canonicalize the document a second time. The canonical form is only
	// signed, so its buffer is reused as soon as the signature is made.
	canonBuf := getBuffer()
	canon := *canonBuf
	doc, keyVersion, err := s.signWith(ctx, receipt.ContextVerify, res.VerifiedAt, func(kv string) (unsignedDoc, error) {
		res.Verify = s.verify
		res.Verify.KeyVersion = kv
		res.Attestation = nil
		canon = res.AppendCanonical(canon[:0])
		return unsignedDoc{doc: res.AppendJSON(dst[:0]), canonical: canon}, nil
	})
	putBuffer(canonBuf, canon)
	if err != nil {
		return nil, err
	}

	v := store.Verification{
		ID:          id,
		VerifiedAt:  at,
		TaskID:      req.TaskID,
		Result:      res.Result,
		OutputHash:  req.Hashes.Output,
		SchemaHash:  req.Hashes.Schema,
		RulesHash:   req.Hashes.Rules,
		RequestHash: req.Hashes.Request,
		KeyVersion:  keyVersion,
		Payment:     gw.payment,
		Payer:       gw.payer,
		Network:     gw.network,
		Wallet:      gw.wallet,
	}
	if req.AgentID != nil {
		v.AgentID = *req.AgentID
		v.Authenticated = authenticated
	}
	// Record even if the caller has gone away: the receipt was signed, and
	// the write is short. A fresh context keeps the cancellation of the
	// request from leaving a signed-but-unrecorded verification behind
	// when the caller disconnects at the wrong instant.
	//
	// But not when the gateway has stopped waiting (this process was
	// stalled, or the signer was slow): the answer would never be
	// delivered, and the record would count for an agent no buyer saw.
	//
	// The same holds while the write waits: the record's deadline is the
	// gateway's (less the margin), and the store checks it against the
	// clock at the last instant before it commits. A deadline error
	// therefore means nothing was recorded. A commit already under way
	// (Badger's group commit taken, PostgreSQL's COMMIT sent) is awaited
	// past the deadline instead, and answered as recorded: a refusal must
	// never hide a record that counts.
	if gw.tooLate(time.Now()) {
		return nil, errGatewayGaveUp()
	}
	rctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), gw.storeBy(time.Now()))
	defer cancel()
	if err := s.history.RecordVerification(rctx, v); err != nil {
		if errors.Is(err, context.DeadlineExceeded) && gw.tooLate(time.Now()) {
			return nil, errGatewayGaveUp()
		}
		s.m.storeError()
		return nil, apierr.Unavailable("verification history store", 5, fmt.Errorf("recording verification: %w", err))
	}
	rec.result, rec.payment = res.Result, gw.payment
	return doc, nil
}

// readBody reads the request body up to the absolute limit. A body declared
// as anything but JSON is 415 (verify.CheckMediaType, the rule the gateway
// applies before it settles); one over the limit is 413 naming the limit,
// whether it announced its length or not.
//
// The body is appended to dst[:0]; the result (or, on error, the buffer
// grown so far) is returned either way, so that the caller can reuse it.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request, dst []byte) ([]byte, error) {
	if err := verify.CheckMediaType(r.Header.Get("Content-Type"), r.ContentLength); err != nil {
		return dst[:0], err
	}
	return readLimited(w, r, s.maxBody, dst)
}

// readLimited reads the request body, at most limit bytes (413 naming the
// limit beyond), appended to dst[:0]. Like readBody it returns the buffer
// either way.
func readLimited(w http.ResponseWriter, r *http.Request, limit int64, dst []byte) ([]byte, error) {
	if r.ContentLength > limit {
		return dst[:0], apierr.TooLarge(limit)
	}
	// The buffer grows with the bytes that arrive, not with what the
	// client announced (growread), read to one byte past limit so
	// MaxBytesReader can say it is over.
	body, err := growread.Read(http.MaxBytesReader(w, r.Body, limit), limit+1, dst)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return body[:0], apierr.TooLarge(limit)
		}
		e := apierr.Invalid(apierr.Field{Field: "body", Problem: "could not be read completely",
			Fix: "Send the whole body again, with a Content-Length that matches it."})
		e.Cause = err
		return body[:0], e
	}
	return body, nil
}

// sign has certd sign a response under signContext, dated attestedAt, and
// returns the complete document and the key version that signed it. build
// makes the unsigned response for a key version (its verify block names
// the key). After a key rotation certd answers "stale key" with the new
// version; the response is rebuilt with it and signed once more. Every
// failure is an *apierr.Error: unreachable certd is 503 retryable,
// anything else 500. Nothing unsigned is returned.
func (s *Server) sign(ctx context.Context, signContext, attestedAt string, build func(keyVersion string) ([]byte, error)) ([]byte, string, error) {
	return s.signWith(ctx, signContext, attestedAt, func(kv string) (unsignedDoc, error) {
		doc, err := build(kv)
		return unsignedDoc{doc: doc}, err
	})
}

// unsignedDoc is a response about to be signed: doc as it is sent (without
// its attestation) and, when its writer produces it directly, canonical,
// the RFC 8785 form of the same document, which is then signed as it
// stands. With canonical nil the signer canonicalizes doc.
type unsignedDoc struct{ doc, canonical []byte }

// signWith is sign for a build that may also write the canonical form.
func (s *Server) signWith(ctx context.Context, signContext, attestedAt string, build func(keyVersion string) (unsignedDoc, error)) ([]byte, string, error) {
	kv, err := s.signer.CurrentKey(ctx)
	if err != nil {
		s.m.signerError(signerErrorKind(err))
		return nil, "", err
	}
	for attempt := 0; ; attempt++ {
		unsigned, err := build(kv)
		if err != nil {
			return nil, "", apierr.Internal(err)
		}
		var att receipt.Attestation
		if unsigned.canonical != nil {
			att, err = s.signer.SignCanonical(ctx, signContext, kv, attestedAt, unsigned.canonical)
		} else {
			att, err = s.signer.Sign(ctx, signContext, kv, attestedAt, unsigned.doc)
		}
		var stale *signer.StaleKeyError
		if errors.As(err, &stale) {
			s.m.signerError("stale_key")
			if attempt == 0 {
				kv = stale.Current
				continue
			}
			// Rotated again within one request: keys are changing right
			// now; the caller's retry will see them settled.
			return nil, "", apierr.Unavailable("signing service", 1, err)
		}
		if err != nil {
			s.m.signerError(signerErrorKind(err))
			return nil, "", err
		}
		doc, err := attach(unsigned.doc, att)
		if err != nil {
			return nil, "", apierr.Internal(err)
		}
		return doc, kv, nil
	}
}

func signerErrorKind(err error) string {
	var e *apierr.Error
	var stale *signer.StaleKeyError
	switch {
	case errors.As(err, &stale):
		return "stale_key"
	case errors.As(err, &e) && e.Code == apierr.CodeUpstreamUnavailable:
		return "unavailable"
	default:
		return "refused"
	}
}

// attach splices the attestation in as the last member of the signed
// document (in place: unsigned is not used afterwards), so the bytes sent
// are exactly the bytes signed plus the attestation.
func attach(unsigned []byte, att receipt.Attestation) ([]byte, error) {
	body := bytes.TrimRight(unsigned, " \t\r\n")
	if len(body) < 2 || body[len(body)-1] != '}' {
		return nil, errors.New("attaching attestation: result is not a JSON object")
	}
	out := body[:len(body)-1]
	if len(body) > 2 {
		out = append(out, ',')
	}
	out = append(out, `"attestation":`...)
	out = att.AppendJSON(out)
	return append(out, '}', '\n'), nil
}
