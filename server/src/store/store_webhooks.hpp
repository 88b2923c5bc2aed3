// The SQL of webhooks (schema/016_webhooks.sql; server.md "Events to the app's
// backend (webhooks)"): registration, the deliverer's leases and outcomes,
// replay, the failed list and the backlog. Free functions on a connection,
// each one short transaction; AdminError for bad input and unknown ids.
#pragma once

#include "core/protocol.hpp"

#include <pqxx/pqxx>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace im::webhooks {

/// The kinds a webhook may ask for (all of them when it names none).
const std::vector<std::string>& all_kinds();

struct Webhook {
    std::string id, url, secret, created;
    std::vector<std::string> kinds;
    std::int64_t backlog = 0; // events (of any kind) committed past the cursors
    std::int64_t failed = 0;  // failed-for-good ranges not replayed
    std::optional<std::string> last_error, last_error_at, last_success_at;
};

/// Registers; `secret` empty: one is made (32 random bytes, hex). Every
/// conversation's cursor starts at its head now: later events are delivered.
/// Returns {id, secret}.
std::pair<std::string, std::string> add(pqxx::connection_base& c, const std::string& url,
                                        const std::vector<std::string>& kinds, const std::string& secret);
/// False when there was no such webhook.
bool remove(pqxx::connection_base& c, const std::string& id);
/// With backlog and last error; secrets included (the caller drops them).
std::vector<Webhook> list(pqxx::connection_base& c);
/// Delivers again from `from_seq` of `conv` (the cursor moves back to
/// from_seq - 1; failed ranges at or above it are dropped from the list).
/// AdminError::not_found for an unknown webhook or conversation.
void replay(pqxx::connection_base& c, const std::string& id, const std::string& conv, std::int64_t from_seq);

struct Failure {
    std::string conv, failed_at;
    std::int64_t from_seq = 0, to_seq = 0, attempts = 0;
    std::string last_error;
};
/// AdminError::not_found for an unknown webhook.
std::vector<Failure> failures(pqxx::connection_base& c, const std::string& id, std::int64_t limit);

// ---------------------------------------------------------------- the deliverer

/// Adds a cursor at 0 for every conversation that has none (made after the
/// registration); the number added.
std::int64_t discover(pqxx::connection_base& c, const std::string& id);

struct Lease {
    std::string conv;
    std::int64_t done_seq = 0, lease_seq = 0, attempts = 0;
    bool give_up = false; // failing for longer than give_up_ms: this attempt is the last
};
/// One conversation of a claim_pages batch: its lease, and its events past
/// the cursor up to `upto` as the backend API's page shows them (all kinds,
/// seq order, with their edit, reactions summary and recall).
struct Claimed {
    Lease lease;
    std::int64_t head = 0;  // the conversation's last seq in the claim's snapshot
    std::int64_t upto = 0;  // the events below cover (done_seq, upto]; == head: caught up
    std::vector<Event> events;
    bool caught_up() const { return upto >= head; }
};
struct ClaimedBatch {
    std::vector<Claimed> convs; // by conv_id
    bool full = false;          // max_events allotted, or a conversation not caught up: more waits
    /// (hinted claims) conversations of the hints, not leased, whose cursor
    /// is already at or past the hint's head: (conv, done_seq).
    std::vector<std::pair<std::string, std::int64_t>> settled;
};
/// claim and the pages in ONE statement (one snapshot, one round trip): the
/// conversations of the webhook with undelivered events, no live lease and
/// their retry time reached, longest-waiting first, each allotted the events
/// it has up to what is left of `max_events` (a conversation that would get
/// none is not claimed, so at most max_events conversations), leased to
/// `owner` for lease_ms, and their allotted events read. A conversation
/// whose events below its cursor were all purged comes with none and upto =
/// head (its cursor moves past them).
/// `hints` (a hinted claim): only these conversations are candidates, each
/// named with the head it was announced at (the bus); found by primary-key
/// probes, so the claim reads what moved, not every cursor of the webhook.
/// Those already delivered past their head come back in `settled`. Without
/// hints (a sweep): every cursor of the webhook is a candidate.
ClaimedBatch claim_pages(pqxx::connection_base& c, const std::string& id, const std::string& owner,
                         std::int64_t lease_ms, std::int64_t max_events, std::int64_t give_up_ms,
                         const std::vector<std::pair<std::string, std::int64_t>>* hints = nullptr);
/// A batch's outcome in one statement (one transaction): every lease of
/// `done` delivered up to its seq (the cursor moves on, the lease is
/// released), every lease of `unread` released unchanged, and (`success`:
/// the receiver answered 2xx) the webhook's last success now. The number of
/// leases of `done` that were lost (their cursor not moved). A conversation
/// of `done` whose page reached the head (`caught_up`, by index) is not
/// claimed again for `linger_ms` (its next page then carries the events of
/// that time, not one or two).
std::int64_t finish_batch(pqxx::connection_base& c, const std::string& id,
                          const std::vector<std::pair<Lease, std::int64_t>>& done, const std::vector<Lease>& unread,
                          bool success, const std::vector<bool>& caught_up = {}, std::int64_t linger_ms = 0);
/// A failed attempt: retried after retry_ms, or (l.give_up) the events up to
/// `to_seq` are recorded as failed and the cursor moves past them.
void attempt_failed(pqxx::connection_base& c, const std::string& id, const Lease& l, std::int64_t to_seq,
                    std::int64_t retry_ms, const std::string& error);

struct Backlog {
    std::string id;
    std::int64_t events = 0;
    double oldest_age_s = 0; // of the oldest undelivered event
};
std::vector<Backlog> backlogs(pqxx::connection_base& c);

} // namespace im::webhooks
