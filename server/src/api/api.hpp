// The request handlers: one request in, one reply frame out. Runs on a
// database worker thread; knows the store (through SessionStore,
// session_store.hpp) and the codec, never the socket.
#pragma once

#include "bus/bus.hpp"
#include "api/jwt.hpp"
#include "core/protocol.hpp"
#include "store/session_store.hpp"
#include "store/store.hpp"

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace im {

struct Handled {
    std::string frame;                  // the reply (empty when dropped)
    std::string code = "OK";            // for metrics
    bool close_after = false;           // UNAUTHENTICATED / STALE_INSTALL
    std::optional<Identity> identity;   // set by a successful hello
    /// A send's reply: when it was answered (off the session's strand), for
    /// the strand stage of im_send_stage_seconds; unset for other replies.
    std::chrono::steady_clock::time_point answered{};
    /// A presence reply: the connection's new watch list (contract 13).
    std::optional<std::vector<std::string>> watch;
};

class TypingLimiter; // presence.hpp
class Metrics;       // core/metrics.hpp

struct ApiContext {
    /// The whole store (gateway probes, the backend API); a session's
    /// requests reach it only through a SessionStore (PgSessionStore).
    Store& store;
    FaultRegistry& faults;
    std::string gateway_id;
    /// Where committed events are announced; a reply that announces an
    /// event goes out only after its payload was handed over.
    NotificationBus* bus = nullptr;
    /// Events this gateway committed, for its own subscribers (notifier.hpp).
    std::function<void(const std::vector<Event>&)> committed;
    /// Signed device tokens (contract section 4a); null when not configured.
    const jwt::Verifier* jwt = nullptr;
    /// typing's 2-a-second forwarding limit and counters (presence.hpp); null: unlimited, uncounted.
    TypingLimiter* typing = nullptr;
    Metrics* metrics = nullptr;
};

/// Checks a JWT handed over by hello or refresh; the claims, or the
/// UNAUTHENTICATED error to answer (the reason is logged, not sent).
Outcome<jwt::Claims> check_jwt(const ApiContext& ctx, const std::string& token);

/// refresh (contract section 4a) checks a signature on the I/O thread: a
/// connection gets at most refresh_per_minute checks in any 60 s. Beyond,
/// the refresh is answered RATE_LIMITED with retry_ms, no check is made and
/// the connection stays open (docs/protocol.md, "refresh").
inline constexpr std::size_t refresh_per_minute = 10;

/// One connection's refreshes of the last minute.
class RefreshBudget {
public:
    /// 0 when a refresh may be checked at `now` (it is counted); else the
    /// ms until one may.
    std::int64_t take(std::chrono::steady_clock::time_point now);

private:
    std::array<std::chrono::steady_clock::time_point, refresh_per_minute> recent_{}; // a ring, oldest at next_
    std::size_t next_ = 0;
    std::size_t used_ = 0;
};

/// A refresh on a connection whose identity is `who`: the reply; `new_exp_ms`
/// is set when the token was accepted (the connection's exp moves to it).
Handled handle_refresh(const ApiContext& ctx, RefreshBudget& budget, const Identity& who, const req::Refresh& r,
                       const std::optional<std::string>& rid, std::optional<std::int64_t>& new_exp_ms);

/// Contract section 4, the order of a connection's requests: any request
/// but hello before a successful hello is UNAUTHENTICATED (the connection
/// stays open: only a failed hello closes it); a second hello is
/// INVALID_ARGUMENT. nullopt when `req` may run now. `who` is the
/// connection's identity (unset before its hello succeeded).
std::optional<Handled> out_of_order(const std::optional<Identity>& who, const Request& req,
                                    const std::optional<std::string>& rid);

/// One request of a connection whose identity is `who`, against `db` (the
/// database on a worker's connection, or tests/fuzz's in-memory model);
/// `db` is nullptr when the database is unreachable (UNAVAILABLE).
Handled handle_request(ApiContext& ctx, SessionStore* db, const std::optional<Identity>& who, const Request& req,
                       const std::optional<std::string>& rid);

/// The same, answering through `done`: read and recall give their worker
/// back once they committed and answer when the bus took their notification
/// (`done` then runs on the bus's thread); the others answer at once.
void handle_request(ApiContext& ctx, SessionStore* db, const std::optional<Identity>& who, const Request& req,
                    const std::optional<std::string>& rid, std::function<void(Handled)> done);

/// Replies that need no database (errors found on the I/O thread).
/// `retry_ms`: RATE_LIMITED's wait (the error frame carries it).
Handled error_reply(const Error& e, const std::optional<std::string>& rid,
                    std::optional<std::int64_t> retry_ms = std::nullopt);

/// The answer to a request that committed but whose notification the bus
/// could not take: the resend is a duplicate and publishes again.
Error unpublished();

} // namespace im
