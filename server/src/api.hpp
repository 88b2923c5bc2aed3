// The request handlers: one request in, one reply frame out. Runs on a
// database worker thread; knows the store and the codec, never the socket.
#pragma once

#include "bus.hpp"
#include "protocol.hpp"
#include "store.hpp"

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
};

struct ApiContext {
    Store& store;
    FaultRegistry& faults;
    std::string gateway_id;
    /// Where committed events are announced; a reply that announces an
    /// event goes out only after its payload was handed over.
    NotificationBus* bus = nullptr;
    /// Events this gateway committed, for its own subscribers (notifier.hpp).
    std::function<void(const std::vector<Event>&)> committed;
};

/// `conn` is nullptr when the database is unreachable.
Handled handle_request(ApiContext& ctx, pqxx::connection_base* conn, const std::optional<Identity>& who,
                       const Request& req, const std::optional<std::string>& rid);

/// A run of sends to one conversation, one database call; one Handled per
/// item, given to `done` once the events' payloads were handed to the bus
/// (on the bus's thread, or on this one).
using RepliesDone = std::function<void(std::vector<Handled>)>;
void handle_send_batch(ApiContext& ctx, pqxx::connection_base* conn, const Identity& who,
                       const std::vector<req::Send>& sends, const std::vector<std::optional<std::string>>& rids,
                       RepliesDone done);
/// The same, waiting for the outcome.
std::vector<Handled> handle_send_batch(ApiContext& ctx, pqxx::connection_base* conn, const Identity& who,
                                       const std::vector<req::Send>& sends,
                                       const std::vector<std::optional<std::string>>& rids);

/// Replies that need no database (errors found on the I/O thread).
Handled error_reply(const Error& e, const std::optional<std::string>& rid);

} // namespace im
