// The contract's storage layer: every SQL statement of the server lives here.
// Each request is one transaction; each function returns a contract outcome
// (a value or an error code), never JSON. Database failures whose outcome is
// unknown become UNAVAILABLE here and nowhere else.
#pragma once

#include "errors.hpp"
#include "faults.hpp"
#include "protocol.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <pqxx/pqxx>

namespace im {

struct Identity {
    std::string user, device, install;
    std::string token_sha256; // hex: which token of the device this connection proved (reissue check)
};

/// Channel for commit notifications (the PostgreSQL bus, pg_bus.hpp; the
/// admin CLI notifies inside its transactions). Payloads carry ids only:
///   "e CONV SEQ [FROM]"   events FROM..SEQ were committed (FROM defaults to SEQ)
///   "r CONV USER DEVICE READ"  a user's read marker moved (from DEVICE)
///   "x CONV"              conversation settings/epoch changed
///   "d - DEVICE"          the device was revoked or got a new token: close its connections
///   "x CONV"              the conversation's epoch changed (subscribers get a hint)
///   "m CONV"              its settings changed (push_full_max): drop cached membership
inline constexpr const char* notify_channel = "im_events";

/// Payloads a request leaves for the bus, to publish after its COMMIT.
using Notes = std::vector<std::string>;

class Store {
public:
    Store(FaultRegistry& faults, LabSwitches lab) : faults_(faults), lab_(lab) {}

    Outcome<Identity> hello(pqxx::connection_base& c, const req::Hello& r);

    struct SendResult { Sent sent; bool drop_reply = false; std::int64_t ts = 0; };
    Outcome<SendResult> send(pqxx::connection_base& c, const Identity& who, const req::Send& r);
    /// Consecutive sends of one connection to ONE conversation, in one
    /// transaction (one lock, one commit): each item is judged on its own,
    /// in order, exactly as a lone send; replies only after the COMMIT.
    /// EMPTY when another transaction held the conversation's row (im_send
    /// skips it, SKIP LOCKED): nothing of the run was written, or only what
    /// a resend answers as a duplicate; the caller runs it again later.
    std::vector<Outcome<SendResult>> send_batch(pqxx::connection_base& c, const Identity& who,
                                                const std::vector<req::Send>& batch);

    /// Runs of sends of several connections (each run: one connection, one
    /// conversation) in ONE statement, so one commit (one WAL flush) for all
    /// of them: group commit. Each item is judged exactly as by send_batch;
    /// a deterministic failure falls back to one send_batch per run, so it
    /// fails only its own request. With lab faults armed, one send_batch
    /// per run. A run whose conversation's row was held gets an EMPTY
    /// result (as send_batch); the others commit without waiting for it.
    struct SendRun {
        const Identity* who;
        const std::vector<req::Send>* sends;
    };
    std::vector<std::vector<Outcome<SendResult>>> send_runs(pqxx::connection_base& c,
                                                            const std::vector<SendRun>& runs);

    Outcome<Page> sync(pqxx::connection_base& c, const Identity& who, const req::Sync& r);
    Outcome<Fetched> fetch(pqxx::connection_base& c, const Identity& who, const req::Fetch& r);
    /// The newest readable events below `before`, ascending (contract section 6).
    Outcome<HistoryPage> history(pqxx::connection_base& c, const Identity& who, const req::History& h);
    Outcome<ConvList> convs(pqxx::connection_base& c, const Identity& who, const req::Convs& q);
    Outcome<Acked> ack(pqxx::connection_base& c, const Identity& who, const req::Ack& r);
    Outcome<ReadOk> read(pqxx::connection_base& c, const Identity& who, const req::Read& r, Notes& notes);
    Outcome<Recalled> recall(pqxx::connection_base& c, const Identity& who, const req::Recall& r);

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
    void add_user(pqxx::connection_base& c, const std::string& user);
    std::string add_device(pqxx::connection_base& c, const std::string& user, const std::string& device);
    /// A new token for an existing device (the old one stops working).
    std::string reissue_token(pqxx::connection_base& c, const std::string& device);
    void revoke_device(pqxx::connection_base& c, const std::string& device);
    void create_conv(pqxx::connection_base& c, const std::string& conv, const std::string& kind,
                     const std::vector<std::string>& members);
    std::int64_t add_member(pqxx::connection_base& c, const std::string& conv, const std::string& user);
    std::int64_t remove_member(pqxx::connection_base& c, const std::string& conv, const std::string& user);
    void set_conv(pqxx::connection_base& c, const std::string& conv, std::optional<std::int64_t> recall_window_ms,
                  std::optional<std::int64_t> push_full_max);
    std::int64_t bump_epoch(pqxx::connection_base& c, const std::string& conv);
    /// Retention purge in batches (one transaction each). Exactly one of
    /// before_seq / older_than_ms is set. Returns the events deleted.
    std::int64_t purge(pqxx::connection_base& c, const std::string& conv, std::optional<std::int64_t> before_seq,
                       std::optional<std::int64_t> older_than_ms, std::int64_t batch = 1000);
    std::vector<std::string> all_convs(pqxx::connection_base& c);
    bool user_exists(pqxx::connection_base& c, const std::string& user);
    bool device_exists(pqxx::connection_base& c, const std::string& device);
    /// True when `token` is the live token of `device`.
    bool token_valid(pqxx::connection_base& c, const std::string& device, const std::string& token);
    /// LAB ONLY negative control: drop the C1 index (the lab's own database).
    static void lab_drop_unique_index(pqxx::connection_base& c);
    /// True when the database belongs to the lab: `fresh` (this start made
    /// its schema) marks it so; otherwise only an earlier mark counts.
    static bool lab_database(pqxx::connection_base& c, bool fresh);

private:
    FaultRegistry& faults_;
    LabSwitches lab_;
    Notes* after_commit_ = nullptr;
};

} // namespace im
