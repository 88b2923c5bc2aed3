// The send path: a connection's run of sends -> the send scheduler (group
// commit) -> a send worker's one statement (Store::send_group, im_send) ->
// finish_run (own subscribers, the bus, the replies; send_run.cpp). Runs on
// the database workers; knows the store and the codec, never the socket.
//
// Names: a *run* is what one connection sent to one conversation in one go
// (Store::send_run, send_run_async / send_run_and_wait, finish_run); a
// *group* is the runs one send worker commits together in one statement
// (Store::send_group, SendScheduler::finish_group).
#pragma once

#include "api/api.hpp"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace im {

class DbPool;
class Metrics;

/// A run of sends to one conversation, one database call (`db` nullptr:
/// the database is unreachable); one Handled per item, given to `done` once
/// the events' payloads were handed to the bus (on the bus's thread, or on
/// this one).
using RepliesDone = std::function<void(std::vector<Handled>)>;
void send_run_async(ApiContext& ctx, SessionStore* db, const Identity& who, const std::vector<req::Send>& sends,
                    const std::vector<std::optional<std::string>>& rids, RepliesDone done);
/// The same, waiting for the outcome.
std::vector<Handled> send_run_and_wait(ApiContext& ctx, SessionStore* db, const Identity& who,
                                       const std::vector<req::Send>& sends,
                                       const std::vector<std::optional<std::string>>& rids);
/// What follows a run's database call (send_run.cpp): its events to this
/// gateway's own subscribers (ctx.committed), their payloads to the bus,
/// then one Handled per item to `done`, each only after the hand-over
/// (UNAVAILABLE for all when the bus refused). `metrics`, when given, gets
/// the publish stage.
void finish_run(ApiContext& ctx, const Identity& who, const std::vector<req::Send>& sends,
                const std::vector<std::optional<std::string>>& rids, std::vector<Outcome<Store::SendResult>> results,
                RepliesDone done, Metrics* metrics = nullptr);

/// The send path's scheduler (group commit): runs of sends from many connections that queue up while
/// the send workers are busy go to the database together, in one statement
/// and one commit (Store::send_group), each item still judged alone and
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
/// With --send-linger-us a worker lingers under load: after a group of several
/// runs it waits, at most that long, until as many runs as that group had
/// are queued on top of those already waiting, so the senders it just
/// answered join the next group instead of taking turns with the others in
/// two half-size groups. A lone run never waits.
///
/// A conversation whose row another transaction holds (an operator's
/// transaction, a purge batch, another gateway's send) is skipped inside the
/// database, not waited for (im_send: SKIP LOCKED): its run comes back
/// unwritten and waits in the queue, tried again after a short back-off
/// (10 ms doubling to 200 ms), while the worker goes on with other
/// conversations. A run still held after `held_limit` (the database timeout,
/// --db-timeout-ms) is answered UNAVAILABLE; the resend is safe.
class SendScheduler {
public:
    /// per_conversation false (the lab's --lab-no-unique-index control only):
    /// runs of one conversation may run in several workers at once again.
    SendScheduler(ApiContext& ctx, DbPool& pool, Metrics& metrics, std::size_t max_runs, std::size_t max_workers,
                 std::size_t max_queue, bool per_conversation = true,
                 std::chrono::milliseconds held_limit = std::chrono::milliseconds(5000),
                 std::chrono::microseconds linger = std::chrono::microseconds(0));
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
        std::chrono::steady_clock::time_point submitted{}; // for the queue stage (metrics.hpp)
        int held_tries = 0;
    };
    class Slot;
    void drain(pqxx::connection_base* c);
    /// Answers a group's runs (or puts back the held ones), each on its own.
    void finish_group(std::vector<Item>& items, std::vector<std::vector<Outcome<Store::SendResult>>>& results);
    /// A worker that unwound: releases `held`, hands its slot to a fresh job
    /// while runs wait, else frees it.
    void give_back(std::vector<std::string>& held) noexcept;
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
    std::condition_variable wake_; // a worker waiting for a held run's back-off, or lingering, hears of new runs
    bool waiting_ = false;         // one worker waits for the back-off of held runs
    std::deque<Item> queue_;
    std::size_t active_ = 0; // send workers running or scheduled in the pool
    std::multiset<std::string> held_; // conversations of the groups being run now
    std::chrono::microseconds linger_; // --send-linger-us
};

} // namespace im
