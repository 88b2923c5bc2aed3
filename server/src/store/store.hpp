// The contract's storage layer: every SQL statement of the server lives in
// its parts, store.cpp and store_*.cpp (store_internal.hpp lists them).
// Each request is one transaction; each function returns a contract outcome
// (a value or an error code), never JSON. Database failures whose outcome is
// unknown become UNAVAILABLE here and nowhere else.
#pragma once

#include "core/errors.hpp"
#include "core/faults.hpp"
#include "core/protocol.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <string>
#include <variant>
#include <vector>

#include <pqxx/pqxx>

namespace im {

struct Identity {
    std::string user, device, install;
    std::string token_sha256; // hex: which token of the device this connection proved (reissue check)
    /// A JWT connection (contract section 4a): its token's `exp` in ms; 0 for
    /// a random device token. token_sha256 is then the device row's current
    /// token hash at hello, so a revocation or a new token ends it too.
    std::int64_t token_exp_ms = 0;
    /// The backend API reading (history, convs): no device to check, the
    /// whole conversation visible, `delivered` the furthest of the user's devices.
    bool backend = false;
};

/// Channel for commit notifications (the PostgreSQL bus, pg_bus.hpp; the
/// admin CLI notifies inside its transactions). Payloads carry ids only:
///   "e CONV SEQ [FROM]"   events FROM..SEQ were committed (FROM defaults to SEQ)
///   "r CONV USER DEVICE READ"  a user's read marker moved (from DEVICE)
///   "x CONV"              conversation settings/epoch changed
///   "d - DEVICE"          the device was revoked or got a new token: close its connections
///   "x CONV"              the conversation's epoch changed (subscribers get a hint)
///   "m CONV"              its settings changed (push_full_max): drop cached membership
///   "t CONV USER 1|0"     USER is typing in CONV, or stopped (contract 13; never stored)
///   "p USER 1|0 LAST_SEEN VERSION"  USER's presence changed (LAST_SEEN "-": never);
///                         several such lines per payload, joined by '\n'
inline constexpr const char* notify_channel = "im_events";

/// How an operator command failed (the admin CLI prints it; the backend
/// API answers 400, 404 or 409 by `kind`).
struct AdminError : std::runtime_error {
    enum Kind { invalid, not_found, exists, not_member };
    AdminError(Kind k, const std::string& msg) : std::runtime_error(msg), kind(k) {}
    Kind kind;
};

/// A backend API key as stored (never the key itself).
struct ApiKeyInfo {
    std::string name, scope, created, revoked; // revoked: "" while it works; times as ISO 8601
};

/// Payloads a request leaves for the bus, to publish after its COMMIT.
using Notes = std::vector<std::string>;

class Store {
public:
    Store(FaultRegistry& faults, LabSwitches lab) : faults_(faults), lab_(lab) {}

    /// Sends announce their events inside their own transaction, NOTIFY on
    /// `channel` (the PostgreSQL bus with --notify-in-commit on): the
    /// notification is delivered at COMMIT or never, so their replies need
    /// no publish after it. Empty (the default): the caller publishes the
    /// sends' Notes after COMMIT. Set before the first send.
    void notify_in_commit(std::string channel) { send_channel_ = std::move(channel); }
    bool notifies_in_commit() const { return !send_channel_.empty(); }

    Outcome<Identity> hello(pqxx::connection_base& c, const req::Hello& r);
    /// hello with a verified JWT (contract section 4a): `user` must exist;
    /// the device row is created for it on its first hello (with a random
    /// token hash nobody holds); a device of another user, or a revoked
    /// one, is UNAUTHENTICATED.
    Outcome<Identity> hello_jwt(pqxx::connection_base& c, const std::string& user, const std::string& device,
                                const std::string& install, std::int64_t exp_ms);

    /// attachments: the msg's list as JSON (contract section 12), "" when none.
    /// An edit's or react's result in a run (send_group) uses the same
    /// shape: `sent` its conv, seq (0: a react that found nothing to turn
    /// off), dup and epoch, `changed` the react's state changed.
    struct SendResult {
        Sent sent;
        bool drop_reply = false;
        std::int64_t ts = 0;
        std::string attachments;
        bool changed = false;
        /// A change's notification went out with its COMMIT (im_write_group
        /// with notify_in_commit); a send's always does then.
        bool notified = false;
    };
    Outcome<SendResult> send(pqxx::connection_base& c, const Identity& who, const req::Send& r);
    /// Consecutive sends of one connection to ONE conversation, in one
    /// transaction (one lock, one commit): each item is judged on its own,
    /// in order, exactly as a lone send; replies only after the COMMIT.
    /// EMPTY when another transaction held the conversation's row (im_send
    /// skips it, SKIP LOCKED): nothing of the run was written, or only what
    /// a resend answers as a duplicate; the caller runs it again later.
    /// With `lock_wait` (a held run's retry, SendScheduler): waits for the
    /// row in its lock queue first, at most that long (im_send_queued);
    /// EMPTY when the row stayed held that long.
    std::vector<Outcome<SendResult>> send_run(pqxx::connection_base& c, const Identity& who,
                                                const std::vector<req::Send>& batch,
                                                std::chrono::milliseconds lock_wait = {});

    /// Runs of sends of several connections (each run: one connection, one
    /// conversation) in ONE statement, so one commit (one WAL flush) for all
    /// of them: group commit. Each item is judged exactly as by send_run;
    /// a deterministic failure falls back to one send_run per run, so it
    /// fails only its own request. With lab faults armed, one send_run
    /// per run. A run whose conversation's row was held gets an EMPTY
    /// result (as send_run); the others commit without waiting for it.
    /// With `lock_wait`, the runs are of ONE conversation and wait for its
    /// row, as send_run's (a group never waits on several rows).
    ///
    /// A run may carry edits and reacts (contract section 12) among its
    /// sends: then the group is one call of im_write_group
    /// (schema/functions/im_change.sql), which judges the items in their
    /// order in the same statement and commit, under the same row locks
    /// (skipped when held, as sends are). With lab faults armed, or after a
    /// deterministic failure, such a run goes item by item (send_run for a
    /// stretch of sends, edit/react for a change), in order.
    struct SendRun {
        const Identity* who;
        const std::vector<req::Write>* items;
    };
    std::vector<std::vector<Outcome<SendResult>>> send_group(pqxx::connection_base& c,
                                                            const std::vector<SendRun>& runs,
                                                            std::chrono::milliseconds lock_wait = {});

    Outcome<Page> sync(pqxx::connection_base& c, const Identity& who, const req::Sync& r);
    Outcome<Fetched> fetch(pqxx::connection_base& c, const Identity& who, const req::Fetch& r);
    /// The newest readable events below `before`, ascending (contract section 6).
    Outcome<HistoryPage> history(pqxx::connection_base& c, const Identity& who, const req::History& h);
    Outcome<ConvList> convs(pqxx::connection_base& c, const Identity& who, const req::Convs& q);
    Outcome<Acked> ack(pqxx::connection_base& c, const Identity& who, const req::Ack& r);
    Outcome<ReadOk> read(pqxx::connection_base& c, const Identity& who, const req::Read& r, Notes& notes);
    Outcome<Recalled> recall(pqxx::connection_base& c, const Identity& who, const req::Recall& r);
    /// Contract section 12 (store_changes.cpp): one statement each, committed
    /// on return; the caller publishes "e CONV SEQ" for a changed or dup result.
    Outcome<Edited> edit(pqxx::connection_base& c, const Identity& who, const req::Edit& r);
    Outcome<Reacted> react(pqxx::connection_base& c, const Identity& who, const req::React& r);

    /// What a gateway needs to fan out commits of one conversation: the
    /// events in [from, to] (none when from > to), who may read which seq,
    /// and whether the conversation is small enough for full `event` pushes.
    struct PushBatch {
        struct Period { std::string user; std::int64_t from, to; }; // to = INT64_MAX when open
        std::vector<Event> events;
        std::vector<Period> periods;
        bool full = true;               // open members <= push_full_max
        std::int64_t head = 0, epoch = 1;
        bool can_read(const std::string& user, std::int64_t seq) const;
        std::int64_t head_for(const std::string& user) const; // capped for former members
    };
    std::optional<PushBatch> load_push(pqxx::connection_base& c, const std::string& conv, std::int64_t from,
                                       std::int64_t to);

    /// C1 rests on the events_idempotency unique index: start and /readyz
    /// check that it exists (and is valid).
    bool idempotency_index_present(pqxx::connection_base& c);

    /// The one statement sync and history read events with ($1 conv, $2..$3
    /// the seq range inside one membership period, $4 the row limit): public
    /// so a test can EXPLAIN it on a big table.
    static std::string event_range_sql(bool newest_first);
    /// Who may read which seq of a conversation, for the fan-out's cache.
    struct Members {
        std::vector<PushBatch::Period> periods;
        bool full = true; // open members <= push_full_max: `event` pushes, else `hint`
    };
    /// The events in [from, to], one autocommit statement.
    std::vector<Event> push_events(pqxx::connection_base& c, const std::string& conv, std::int64_t from,
                                   std::int64_t to);
    Members push_members(pqxx::connection_base& c, const std::string& conv);

    /// Of these (device, token_sha256 hex) pairs of open connections, the
    /// ones whose token no longer works: device revoked, deleted or given a
    /// new token. One autocommit statement.
    using TokenPairs = std::vector<std::pair<std::string, std::string>>;
    TokenPairs stale_tokens(pqxx::connection_base& c, const TokenPairs& open);

    bool ping(pqxx::connection_base& c) { return probe(c); }
    static bool probe(pqxx::connection_base& c);

    // ---- typing and presence (contract section 13; store_presence.cpp)
    /// typing: NOT_MEMBER unless `who` has an open period in `conv`; else
    /// whether the conversation is pushed to (open members <= push_full_max).
    Outcome<bool> typing_gate(pqxx::connection_base& c, const Identity& who, const std::string& conv);
    /// presence: of `users` (sorted, unique), those who share or shared a
    /// conversation with `who`, as presence_users has them (last_seen: now
    /// by the database clock when online).
    Outcome<PresenceList> presence(pqxx::connection_base& c, const Identity& who, const std::vector<std::string>& users);
    /// A user's aggregate presence changed: what the bus carries ("p ...").
    struct PresenceChange {
        PresenceInfo info;
        std::int64_t version = 0; // presence_users.version: later changes have larger ones
        std::string payload() const;
    };
    /// One gateway's presence writes (api/presence.hpp), each one transaction.
    /// `online`: users this gateway now has a connection past welcome for;
    /// `offline`: users whose last connection here closed, with the ms time.
    /// `full`: `online` is everything this gateway has (its other rows go,
    /// offline at `now_ms`).
    /// Renews the gateway's lease to now + lease_ms. Returns the users whose
    /// aggregate `online` changed.
    static std::vector<PresenceChange> presence_write(pqxx::connection_base& c, const std::string& gateway,
                                                      std::int64_t lease_ms, const std::vector<std::string>& online,
                                                      const std::vector<std::pair<std::string, std::int64_t>>& offline,
                                                      bool full, std::int64_t now_ms);
    /// Renews the lease; false when the gateway's row was gone (swept: the
    /// caller writes its whole state again, full).
    static bool presence_heartbeat(pqxx::connection_base& c, const std::string& gateway, std::int64_t lease_ms);
    /// Removes every gateway whose lease ran out with its rows; its users
    /// with no live gateway left go offline, last seen at its last heartbeat.
    static std::vector<PresenceChange> presence_sweep(pqxx::connection_base& c);
    /// A gateway stopping: its rows and its lease go.
    static std::vector<PresenceChange> presence_release(pqxx::connection_base& c, const std::string& gateway,
                                                        std::int64_t at_ms);

    // ---- the PostgreSQL notification bus (pg_bus.hpp)
    /// A session that only publishes: its NOTIFY transactions skip the WAL
    /// flush wait (the rows they announce were committed durably before).
    static void open_publisher(pqxx::connection_base& c);
    /// One NOTIFY per payload, in one autocommit statement.
    static void publish(pqxx::connection_base& c, const Notes& payloads);

    // ---- operator commands (admin CLI); throw std::runtime_error on failure
    /// Where these commands put their notifications: null (the default)
    /// notifies inside each transaction (the PostgreSQL bus); otherwise the
    /// payloads of committed commands are appended to `sink`, and the caller
    /// publishes them on its bus after COMMIT (admin --bus nats://...).
    void notify_after_commit(Notes* sink) { after_commit_ = sink; }
    /// False when the user existed already.
    bool add_user(pqxx::connection_base& c, const std::string& user);
    std::string add_device(pqxx::connection_base& c, const std::string& user, const std::string& device);
    /// A new token for an existing device (the old one stops working).
    std::string reissue_token(pqxx::connection_base& c, const std::string& device);
    void revoke_device(pqxx::connection_base& c, const std::string& device);
    /// False when the same conversation (kind and current members) exists;
    /// AdminError::exists when one with other settings does.
    bool create_conv(pqxx::connection_base& c, const std::string& conv, const std::string& kind,
                     const std::vector<std::string>& members);
    /// The join's seq. A member already: with `already`, sets it and returns
    /// the seq of the join that opened the period; without, AdminError::exists.
    std::int64_t add_member(pqxx::connection_base& c, const std::string& conv, const std::string& user,
                            bool* already = nullptr);
    std::int64_t remove_member(pqxx::connection_base& c, const std::string& conv, const std::string& user);
    void set_conv(pqxx::connection_base& c, const std::string& conv, std::optional<std::int64_t> recall_window_ms,
                  std::optional<std::int64_t> push_full_max, std::optional<std::int64_t> edit_window_ms = std::nullopt);
    std::int64_t bump_epoch(pqxx::connection_base& c, const std::string& conv);
    /// Retention purge in batches (one transaction each). Exactly one of
    /// before_seq / older_than_ms is set. Returns the events deleted.
    std::int64_t purge(pqxx::connection_base& c, const std::string& conv, std::optional<std::int64_t> before_seq,
                       std::optional<std::int64_t> older_than_ms, std::int64_t batch = 1000);
    std::vector<std::string> all_convs(pqxx::connection_base& c);

    // ---- moderation (schema/015; server.md, "Rate limits and moderation")
    /// Mutes `user` in `conv` until `until_iso` (ISO 8601), or for `for_ms`
    /// from now, or (both unset/empty) until cleared; replaces an earlier
    /// mute. Returns the end as ISO 8601 UTC ("" for open-ended).
    /// AdminError: not_found (conversation, user), invalid (the time).
    std::string set_mute(pqxx::connection_base& c, const std::string& conv, const std::string& user,
                         const std::string& until_iso, std::optional<std::int64_t> for_ms = std::nullopt);
    /// False when there was no mute.
    bool clear_mute(pqxx::connection_base& c, const std::string& conv, const std::string& user);
    struct Redacted {
        std::int64_t seq;   // the recall event's seq
        bool already;       // it was recalled before (by its sender or an operator): that recall
    };
    /// The operator's recall of msg `seq` (sender null), whatever the window.
    Redacted redact(pqxx::connection_base& c, const std::string& conv, std::int64_t seq);
    /// Recalls every msg of `user` in `conv` not recalled yet, `batch` per
    /// transaction; returns how many it recalled (a rerun resumes).
    std::int64_t redact_user(pqxx::connection_base& c, const std::string& conv, const std::string& user,
                             std::int64_t batch = 500);
    // ---- a user's data (schema/017; server.md, "A user's data"; store_userdata.cpp)
    /// What an erase did (this run: a rerun counts only what was left).
    struct Erased {
        std::int64_t devices = 0;     // revoked
        std::int64_t memberships = 0; // closed (a leave event each)
        std::int64_t convs = 0;       // conversations gone through
        std::int64_t events = 0;      // their events whose content went
        std::int64_t recalls = 0;     // operator recalls appended (msgs not recalled before)
        std::int64_t uploads = 0;     // their uploads no msg references any more, deleted
    };
    /// Erases `user` (store_admin.cpp): revokes their devices, closes their
    /// memberships (leave events), then per conversation, `batch` events per
    /// transaction: an operator recall of each msg not recalled yet, the
    /// request keys into idem_tombstones, the content gone (body,
    /// attachments, emoji, key), the row kept with `erased`. Resumable: a
    /// rerun finishes what an interrupted run left. AdminError::not_found.
    Erased erase_user(pqxx::connection_base& c, const std::string& user, std::int64_t batch = 500);
    /// One line of a user's export (GET /v1/users/{user}/export): `type`
    /// and its fields, as (name, value) pairs; a value is JSON text (a
    /// number, a quoted string, null, an array) ready to write. An `event`
    /// is in `event` instead (rendered as pages render it).
    struct ExportRecord {
        std::string type;
        std::vector<std::pair<std::string, std::string>> fields;
        std::optional<Event> event;
    };
    /// Where an export stands between batches (keyset, no cursor held: a
    /// slow reader holds no database connection and no snapshot).
    struct ExportCursor {
        int phase = 0;                  // 0 user, devices, uploads; 1 conversations; 2 events; 3 done
        std::vector<std::string> convs; // the user's conversations (phase 0 reads them)
        std::size_t conv_at = 0;        // phases 1 and 2: the next conversation
        std::int64_t after = 0;         // phase 2: the last seq given in convs[conv_at]
        std::int64_t counted = 0;       // records so far
    };
    /// The next records of `user`'s export, at most about `limit`; empty
    /// when done. AdminError::not_found for an unknown user (first call).
    std::vector<ExportRecord> export_batch(pqxx::connection_base& c, const std::string& user, ExportCursor& cur,
                                           std::int64_t limit = 500);
    bool user_exists(pqxx::connection_base& c, const std::string& user);
    bool device_exists(pqxx::connection_base& c, const std::string& device);
    /// True when `token` is the live token of `device`.
    bool token_valid(pqxx::connection_base& c, const std::string& device, const std::string& token);

    // ---- backend API keys (schema/008) and the API's sends
    /// A new key `imk_<key_id>_<secret>` (returned once; only its SHA-256 is kept).
    std::string add_api_key(pqxx::connection_base& c, const std::string& name, const std::string& scope);
    void revoke_api_key(pqxx::connection_base& c, const std::string& name);
    std::vector<ApiKeyInfo> list_api_keys(pqxx::connection_base& c);
    /// The name and scope of a working key; nullopt for a malformed, unknown
    /// or revoked one. Hashes compared in constant time (CRYPTO_memcmp).
    std::optional<std::pair<std::string, std::string>> check_api_key(pqxx::connection_base& c, const std::string& key);
    /// The identity the backend API sends as on USER's behalf: the user's
    /// hidden device (id `:api:` + a hash of the user id, made on first use,
    /// its token never known to anyone). nullopt when the user does not exist.
    std::optional<Identity> backend_sender(pqxx::connection_base& c, const std::string& user);
    /// Whether the conversation exists: the backend API (trusted, unlike a
    /// WebSocket client) answers an unknown one 404, not NOT_MEMBER.
    bool conversation_exists(pqxx::connection_base& c, const std::string& conv);
    /// Device ids starting with this are the backend API's own.
    static constexpr std::string_view backend_device_prefix = ":api:";

    /// LAB ONLY negative control: drop the C1 index (the lab's own database).
    static void lab_drop_unique_index(pqxx::connection_base& c);
    /// True when the database belongs to the lab: `fresh` (this start made
    /// its schema) marks it so; otherwise only an earlier mark counts.
    static bool lab_database(pqxx::connection_base& c, bool fresh);

private:
    /// im_change, or the lab's variant while one of its rules is broken.
    std::string change_function();
    /// send_run's body, on the sends where they are (no copies).
    std::vector<Outcome<SendResult>> send_items(pqxx::connection_base& c, const Identity& who,
                                                const std::vector<const req::Send*>& batch,
                                                std::chrono::milliseconds lock_wait);
    /// A run with changes, item by item in order (send_group's fallback).
    std::vector<Outcome<SendResult>> write_run_one_by_one(pqxx::connection_base& c, const Identity& who,
                                                          const std::vector<req::Write>& items,
                                                          std::chrono::milliseconds lock_wait);

    FaultRegistry& faults_;
    LabSwitches lab_;
    std::string send_channel_; // notify_in_commit()
    Notes* after_commit_ = nullptr;
};

/// A run of writes item by item, in order (Store::send_group's fallback,
/// SessionStore::write_run's default): `sends` for each stretch of
/// consecutive sends (EMPTY: the conversation's row was held, and the run
/// goes back whole; what committed before answers as duplicates then),
/// `edit` or `react` for a change.
std::vector<Outcome<Store::SendResult>> write_in_order(
    const std::vector<req::Write>& run,
    const std::function<std::vector<Outcome<Store::SendResult>>(const std::vector<req::Send>&)>& sends,
    const std::function<Outcome<Edited>(const req::Edit&)>& edit,
    const std::function<Outcome<Reacted>(const req::React&)>& react);

} // namespace im
