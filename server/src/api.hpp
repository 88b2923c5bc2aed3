// The request handlers: one request in, one reply frame out. Runs on a
// database worker thread; knows the store and the codec, never the socket.
#pragma once

#include "bus.hpp"
#include "jwt.hpp"
#include "protocol.hpp"
#include "store.hpp"

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
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
    /// Signed device tokens (contract section 4a); null when not configured.
    const jwt::Verifier* jwt = nullptr;
};

/// Checks a JWT handed over by hello or refresh; the claims, or the
/// UNAUTHENTICATED error to answer (the reason is logged, not sent).
Outcome<jwt::Claims> check_jwt(const ApiContext& ctx, const std::string& token);

/// `conn` is nullptr when the database is unreachable.
Handled handle_request(ApiContext& ctx, pqxx::connection_base* conn, const std::optional<Identity>& who,
                       const Request& req, const std::optional<std::string>& rid);

/// The same, answering through `done`: read and recall give their worker
/// back once they committed and answer when the bus took their notification
/// (`done` then runs on the bus's thread); the others answer at once.
void handle_request(ApiContext& ctx, pqxx::connection_base* conn, const std::optional<Identity>& who,
                    const Request& req, const std::optional<std::string>& rid, std::function<void(Handled)> done);

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

class DbPool;
struct Metrics;

/// Group commit: runs of sends from many connections that queue up while
/// the send workers are busy go to the database together, in one statement
/// and one commit (Store::send_runs), each item still judged alone and
/// answered only after the commit and the bus hand-over. A run submitted
/// while a send worker is idle goes alone at once: grouping costs no
/// latency, it only happens when sends would wait anyway.
///
/// At most `max_workers` database workers run sends at once (--send-workers);
/// a worker that finished a group takes the next one while runs are queued,
/// so under load the groups grow instead of more transactions competing for
/// the same cores. The other workers stay free for reads. A run for a
/// conversation that another send worker's group holds waits in the queue
/// (it would only wait on that group's row lock inside the database), so one
/// busy or stuck conversation occupies one send worker, never all of them.
///
/// A conversation whose row another transaction holds (an operator's
/// transaction, a purge batch, another gateway's send) is skipped inside the
/// database, not waited for (im_send: SKIP LOCKED): its run comes back
/// unwritten and waits in the queue, tried again after a short back-off
/// (10 ms doubling to 200 ms), while the worker goes on with other
/// conversations. A run still held after `held_limit` (the database timeout,
/// --db-timeout-ms) is answered UNAVAILABLE; the resend is safe.
class SendCombiner {
public:
    /// per_conversation false (the lab's --lab-no-unique-index control only):
    /// runs of one conversation may run in several workers at once again.
    SendCombiner(ApiContext& ctx, DbPool& pool, Metrics& metrics, std::size_t max_runs, std::size_t max_workers,
                 std::size_t max_queue, bool per_conversation = true,
                 std::chrono::milliseconds held_limit = std::chrono::milliseconds(5000));
    /// Queues a run; false when too many runs wait already (answer UNAVAILABLE).
    bool submit(Identity who, std::vector<req::Send> sends, std::vector<std::optional<std::string>> rids,
                RepliesDone done);

private:
    struct Item {
        Identity who;
        std::vector<req::Send> sends;
        std::vector<std::optional<std::string>> rids;
        RepliesDone done;
        // A run whose conversation was held: not tried again before
        // not_before; answered UNAVAILABLE once held_limit passed since held_since.
        std::chrono::steady_clock::time_point not_before{}, held_since{};
        int held_tries = 0;
    };
    void drain(pqxx::connection_base* c);
    /// Puts back a run whose conversation was held (or answers it UNAVAILABLE
    /// when it has been held too long).
    void requeue(Item it);
    /// The next group under the lock, skipping conversations other groups
    /// hold; empty (and this worker signed off) when nothing can be taken.
    /// `done` are the conversations of this worker's last group, released.
    std::vector<Item> take(std::vector<std::string>& done);
    /// Gives back the conversations of a finished group (mu_ held); clears `done`.
    void release(std::vector<std::string>& done);

    ApiContext& ctx_;
    DbPool& pool_;
    Metrics& metrics_;
    std::size_t max_runs_;
    std::size_t max_workers_;
    std::size_t max_queue_;
    bool per_conversation_;
    std::chrono::milliseconds held_limit_;
    std::mutex mu_;
    std::condition_variable wake_; // a worker waiting for a held run's back-off hears of new runs
    bool waiting_ = false;         // one worker waits for the back-off of held runs
    std::deque<Item> queue_;
    std::size_t active_ = 0; // send workers running or scheduled in the pool
    std::multiset<std::string> held_; // conversations of the groups being run now
};

/// Replies that need no database (errors found on the I/O thread).
Handled error_reply(const Error& e, const std::optional<std::string>& rid);

} // namespace im
