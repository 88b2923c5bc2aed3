// The send path: a connection's run of writes -> the send scheduler (group
// commit) -> a send worker's one statement (Store::send_group, im_send) ->
// finish_run (own subscribers, the bus, the replies; send_run.cpp). Runs on
// the database workers; knows the store and the codec, never the socket.
//
// Names: a *run* is what one connection sent to one conversation in one go
// (Store::send_run, send_run_async / send_run_and_wait, finish_run); a
// *group* is the runs one send worker commits together in one statement
// (Store::send_group, SendScheduler::finish_group). A run's items are
// *writes* (req::Write): sends, and the edits and reacts of contract
// section 12, which ride the same runs and groups in arrival order (one
// statement per group either way: im_send, or im_write_group when a group
// carries a change).
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

/// A run of writes to one conversation, one database call (`db` nullptr:
/// the database is unreachable); one Handled per item, given to `done` once
/// the events' payloads were handed to the bus (on the bus's thread, or on
/// this one).
using RepliesDone = std::function<void(std::vector<Handled>)>;
void send_run_async(ApiContext& ctx, SessionStore* db, const Identity& who, const std::vector<req::Write>& writes,
                    const std::vector<std::optional<std::string>>& rids, RepliesDone done);
/// The same, waiting for the outcome.
std::vector<Handled> send_run_and_wait(ApiContext& ctx, SessionStore* db, const Identity& who,
                                       const std::vector<req::Write>& writes,
                                       const std::vector<std::optional<std::string>>& rids);
/// What follows a run's database call (send_run.cpp): its events to this
/// gateway's own subscribers (ctx.committed), their payloads to the bus,
/// then one Handled per item to `done`, each only after the hand-over
/// (UNAVAILABLE for all when the bus refused). `metrics`, when given, gets
/// the publish stage.
void finish_run(ApiContext& ctx, const Identity& who, const std::vector<req::Write>& writes,
                const std::vector<std::optional<std::string>>& rids, std::vector<Outcome<Store::SendResult>> results,
                RepliesDone done, Metrics* metrics = nullptr);

/// The send path's scheduler (group commit): runs of writes from many connections that queue up while
/// the send workers are busy go to the database together, in one statement
/// and one commit (Store::send_group), each item still judged alone and
/// answered only after the commit and the bus hand-over. A run submitted
/// while a send worker is idle goes alone at once: grouping costs no
/// latency, it only happens when writes would wait anyway.
///
/// At most `max_workers` database workers run writes at once (--send-workers);
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
/// database, not waited for (im_send: SKIP LOCKED): a group never waits on a
/// foreign row, and the run comes back unwritten, *held*. It is not tried
/// again by the send workers but by a *lock waiter*: a database worker
/// outside the send workers (at most `max_waiters` at once, see the
/// constructor) that takes the held run together with the runs of the same
/// conversation queued behind it (never another conversation's) and runs
/// them through im_send_queued, which waits for the conversation's gate and
/// row in PostgreSQL's lock queue: late arrivals from every gateway are
/// served in the order they queued (contract section 6), instead of a back-off that the gateway
/// holding the row keeps winning. Each wait is bounded (lock_timeout: half
/// of --db-timeout-ms, and never past the run's own bound); a wait that ends
/// without the row puts the run back for another one, and a run held
/// `held_limit` (--db-timeout-ms) since it first came back held is answered
/// UNAVAILABLE (the resend is safe). A waiter stays with its conversation
/// while runs of it queue and the last wait got the row; after a wait that
/// did not, it serves the other held conversations first. So held
/// conversations never occupy a send worker: every other conversation's
/// writes keep their latency.
class SendScheduler {
public:
    /// per_conversation false (the lab's --lab-no-unique-index control only):
    /// runs of one conversation may run in several workers at once again.
    /// Lock waiters: as many as the pool has workers beyond the send workers
    /// and one kept for reads, at least 1.
    SendScheduler(ApiContext& ctx, DbPool& pool, Metrics& metrics, std::size_t max_runs, std::size_t max_workers,
                 std::size_t max_queue, bool per_conversation = true,
                 std::chrono::milliseconds held_limit = std::chrono::milliseconds(5000),
                 std::chrono::microseconds linger = std::chrono::microseconds(0));
    /// Queues a run; false when too many runs wait already (answer UNAVAILABLE).
    bool submit(Identity who, std::vector<req::Write> writes, std::vector<std::optional<std::string>> rids,
                RepliesDone done);

private:
    struct Item {
        Identity who;
        std::vector<req::Write> writes;
        std::vector<std::optional<std::string>> rids;
        RepliesDone done;
        // A run whose conversation was held: only a lock waiter takes it;
        // answered UNAVAILABLE once held_limit passed since held_since.
        bool held = false;
        int waits = 0; // lock waits it took part in without getting the row
        std::chrono::steady_clock::time_point held_since{};
        std::chrono::steady_clock::time_point submitted{}; // for the queue stage (metrics.hpp)
    };
    class Slot;
    void drain(pqxx::connection_base* c);
    /// A lock waiter's job: held runs, one conversation at a time.
    void wait_for_rows(pqxx::connection_base* c);
    /// A group's one statement (Store::send_group; `lock_wait` > 0: waiting
    /// for its one conversation's row, at most that long), with its metrics;
    /// UNAVAILABLE for every run when it throws.
    std::vector<std::vector<Outcome<Store::SendResult>>> run_group(pqxx::connection_base& c,
                                                                   const std::vector<Item>& items,
                                                                   std::chrono::milliseconds lock_wait);
    /// Answers a group's runs (or puts back the held ones), each on its own;
    /// true when none was held.
    bool finish_group(std::vector<Item>& items, std::vector<std::vector<Outcome<Store::SendResult>>>& results,
                      bool waited);
    /// A worker that unwound: releases `held`, hands its slot to a fresh job
    /// while runs wait, else frees it.
    void give_back(std::vector<std::string>& held, bool waiter) noexcept;
    /// Puts back the runs whose conversation was held, in their order, at
    /// the head of the queue for a lock waiter (or answers one UNAVAILABLE
    /// when it has been held too long).
    void requeue(std::vector<Item> held, bool waited);
    /// The next group under the lock, skipping conversations other groups
    /// hold and held runs; empty (and this worker signed off) when nothing
    /// can be taken. `done` are the conversations of this worker's last
    /// group, released.
    std::vector<Item> take(std::vector<std::string>& done);
    /// A lock waiter's next group: the runs of one conversation, the first
    /// of them held; `done` as for take(). `stay`: the last wait got its row,
    /// so the waiter keeps to that conversation while runs of it queue.
    std::vector<Item> take_held(std::vector<std::string>& done, bool stay);
    /// Gives back the conversations of a finished group (mu_ held); clears
    /// `done`; starts a lock waiter if a held run can now be taken.
    void release(std::vector<std::string>& done);
    /// Starts a lock waiter (mu_ held) when a held run of a conversation no
    /// group holds waits and fewer than max_waiters_ run.
    void start_waiter();

    ApiContext& ctx_;
    DbPool& pool_;
    Metrics& metrics_;
    std::size_t max_runs_;
    std::size_t max_workers_;
    std::size_t max_queue_;
    bool per_conversation_;
    std::chrono::milliseconds held_limit_;
    std::chrono::milliseconds lock_wait_; // one wait's bound: the pool's lock_timeout
    std::mutex mu_;
    std::condition_variable wake_; // a lingering worker hears of new runs
    std::deque<Item> queue_;
    std::size_t held_runs_ = 0; // runs in queue_ that are held (for lock waiters)
    std::size_t active_ = 0;    // send workers running or scheduled in the pool
    std::size_t waiters_ = 0;   // lock waiters running or scheduled in the pool
    std::size_t max_waiters_;
    std::multiset<std::string> running_; // conversations of the groups being run now
    std::chrono::microseconds linger_; // --send-linger-us
};

} // namespace im
