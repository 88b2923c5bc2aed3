#include "api/send_scheduler.hpp"

#include "store/db_pool.hpp"
#include "core/log.hpp"
#include "core/metrics.hpp"

#include <algorithm>
#include <chrono>

namespace im {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

} // namespace

SendScheduler::SendScheduler(ApiContext& ctx, DbPool& pool, Metrics& metrics, std::size_t max_runs,
                           std::size_t max_workers, std::size_t max_queue, bool per_conversation,
                           std::chrono::milliseconds held_limit, std::chrono::microseconds linger)
    : ctx_(ctx), pool_(pool), metrics_(metrics), max_runs_(std::max<std::size_t>(1, max_runs)),
      max_workers_(std::max<std::size_t>(1, max_workers)), max_queue_(max_queue), per_conversation_(per_conversation),
      held_limit_(held_limit), lock_wait_(pool.lock_timeout()),
      // The pool's workers beyond the send workers, less one kept for reads;
      // at least one, or a held conversation would have no one to wait for it.
      max_waiters_(pool.size() > max_workers_ + 1 ? pool.size() - max_workers_ - 1 : 1), linger_(linger) {
    metrics_.send_workers = static_cast<long long>(max_workers_);
}

bool SendScheduler::submit(Identity who, std::vector<req::Write> writes, std::vector<std::optional<std::string>> rids,
                          RepliesDone done) {
    std::lock_guard lk(mu_);
    if (queue_.size() >= max_queue_) return false;
    queue_.push_back(Item{std::move(who), std::move(writes), std::move(rids), std::move(done)});
    queue_.back().submitted = std::chrono::steady_clock::now();
    metrics_.send_runs_queued = static_cast<long long>(queue_.size());
    // A lingering worker counts it.
    wake_.notify_all();
    // A held run left without a lock waiter (the pool's queue was full when
    // it was put back) gets one now.
    start_waiter();
    // Every send worker busy: the first to finish its group takes this run.
    if (active_ >= max_workers_) return true;
    ++active_;
    // The pool's lock is taken under ours (never the other way round).
    if (pool_.submit([this](pqxx::connection_base* c) { drain(c); })) return true;
    --active_;
    queue_.pop_back();
    metrics_.send_runs_queued = static_cast<long long>(queue_.size());
    return false;
}

void SendScheduler::release(std::vector<std::string>& done) {
    for (const auto& conv : done) running_.erase(running_.find(conv));
    const bool freed = !done.empty();
    done.clear();
    if (freed) start_waiter();
}

void SendScheduler::start_waiter() {
    if (held_runs_ == 0 || waiters_ >= max_waiters_) return;
    const bool ready = std::any_of(queue_.begin(), queue_.end(), [&](const Item& it) {
        return it.held && !running_.count(write_conv(it.writes.front()));
    });
    if (!ready) return; // the group holding it releases it, and starts one then
    ++waiters_;
    // The pool's lock is taken under ours (never the other way round). A
    // full pool: the next release or requeue tries again.
    if (!pool_.submit([this](pqxx::connection_base* c) { wait_for_rows(c); })) --waiters_;
}

std::vector<SendScheduler::Item> SendScheduler::take(std::vector<std::string>& done) {
    std::vector<Item> items;
    std::unique_lock lk(mu_);
    // Linger (--send-linger-us): after a group of several runs the load is
    // a crowd, and the senders just answered send again within a round
    // trip. Starting at once would split them off into a group of their own
    // (two half groups taking turns, each paying the statement's fixed
    // cost); waiting for as many runs as the last group had, on top of those
    // queued now, lets them join. Never for a lone run, never past linger_.
    // Held runs are the lock waiters': not counted.
    const std::size_t last_group = done.size();
    release(done);
    if (linger_.count() > 0 && last_group > 1) {
        const auto fresh = [&] { return queue_.size() - held_runs_; };
        const std::size_t want = std::min(max_runs_, fresh() + last_group);
        const auto until = std::chrono::steady_clock::now() + linger_;
        if (fresh() < want) ++metrics_.send_lingers;
        while (fresh() < want && wake_.wait_until(lk, until) != std::cv_status::timeout) {
        }
        Watchdog::progress(); // lingering is not a database round trip
    }
    // Oldest first; several runs of one conversation may share the group
    // (the statement runs them in order under one row lock). A held run is
    // a lock waiter's, and a later run of its conversation stays behind it.
    std::set<std::string> behind;
    for (auto it = queue_.begin(); it != queue_.end() && items.size() < max_runs_;) {
        const auto& conv = write_conv(it->writes.front());
        if (it->held) behind.insert(conv);
        if (it->held || (per_conversation_ && running_.count(conv)) || (!behind.empty() && behind.count(conv))) {
            ++it;
            continue;
        }
        items.push_back(std::move(*it));
        it = queue_.erase(it);
    }
    const auto taken = std::chrono::steady_clock::now();
    for (const auto& it : items) {
        running_.insert(write_conv(it.writes.front()));
        metrics_.observe_send_stage(Metrics::SendStage::queue,
                                    std::chrono::duration<double>(taken - it.submitted).count());
    }
    metrics_.send_runs_queued = static_cast<long long>(queue_.size());
    // Signing off under the same lock that submit() checks: a run queued
    // after this sees the slot free and schedules a worker of its own. Runs
    // skipped here belong to a group still running (its worker takes them)
    // or are held (a lock waiter takes them).
    if (items.empty()) --active_;
    return items;
}

std::vector<SendScheduler::Item> SendScheduler::take_held(std::vector<std::string>& done, bool stay) {
    std::vector<Item> items;
    std::lock_guard lk(mu_);
    const std::string last = done.empty() ? std::string() : done.front();
    for (const auto& conv : done) running_.erase(running_.find(conv));
    done.clear();
    // Which conversation: the last one again while its runs queue and its
    // last wait got the row (its queue on the row is being served); else the
    // held run of a free conversation that waited least, the oldest first.
    std::string conv;
    if (stay && !last.empty() && !running_.count(last) &&
        std::any_of(queue_.begin(), queue_.end(), [&](const Item& it) { return write_conv(it.writes.front()) == last; }))
        conv = last;
    if (conv.empty()) {
        const Item* best = nullptr;
        for (const auto& it : queue_)
            if (it.held && !running_.count(write_conv(it.writes.front())) && (!best || it.waits < best->waits)) best = &it;
        if (best) conv = write_conv(best->writes.front());
    }
    if (conv.empty()) {
        --waiters_; // signed off under the lock that start_waiter() checks
        return items;
    }
    // Its runs in queue order, held or not (they would all wait on its row).
    for (auto it = queue_.begin(); it != queue_.end() && items.size() < max_runs_;) {
        if (write_conv(it->writes.front()) != conv) {
            ++it;
            continue;
        }
        if (it->held) --held_runs_;
        items.push_back(std::move(*it));
        it = queue_.erase(it);
    }
    running_.insert(conv);
    done.push_back(conv);
    const auto taken = std::chrono::steady_clock::now();
    for (const auto& it : items)
        metrics_.observe_send_stage(Metrics::SendStage::queue,
                                    std::chrono::duration<double>(taken - it.submitted).count());
    metrics_.send_runs_queued = static_cast<long long>(queue_.size());
    start_waiter(); // another held conversation, for another waiter
    return items;
}

void SendScheduler::requeue(std::vector<Item> held, bool waited) {
    const auto now = std::chrono::steady_clock::now();
    std::vector<Item> back;
    for (auto& it : held) {
        if (!it.held) it.held_since = now;
        it.held = true;
        if (waited) ++it.waits;
        if (now - it.held_since >= held_limit_) {
            log_warn("send_conversation_held", {{"conv", write_conv(it.writes.front())},
                                                {"ms", static_cast<long>(held_limit_.count())}});
            try {
                finish_run(ctx_, it.who, it.writes, it.rids,
                           std::vector<Outcome<Store::SendResult>>(
                               it.writes.size(), unavailable("conversation busy, retry with the same request")),
                           std::move(it.done));
            } catch (const std::exception& e) {
                log_error("send_finish_failed", {{"conv", write_conv(it.writes.front())}, {"err", e.what()}});
            }
            continue;
        }
        back.push_back(std::move(it));
    }
    if (back.empty()) return;
    std::lock_guard lk(mu_);
    // At the head, in their order: they are older than every run queued
    // since. The group that ran them still holds their conversations; its
    // release (or this call, for a conversation it no longer holds) starts
    // a lock waiter at once: no timer, no back-off.
    metrics_.send_runs_held += static_cast<long long>(back.size());
    held_runs_ += back.size();
    queue_.insert(queue_.begin(), std::make_move_iterator(back.begin()), std::make_move_iterator(back.end()));
    metrics_.send_runs_queued = static_cast<long long>(queue_.size());
    start_waiter();
}

// A send worker's slot (one of active_) and the conversations of its last
// group (in running_), given back however drain() ends: an exception out of a
// group (an allocation, a callback) must not keep them forever, or those
// conversations and the slot would never be scheduled again.
class SendScheduler::Slot {
public:
    Slot(SendScheduler& s, bool waiter) : s_(s), waiter_(waiter) {}
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    ~Slot() {
        if (owned_) s_.give_back(held, waiter_);
    }
    /// The slot was given back under the lock (take() signed off) or went
    /// with a fresh job: nothing left to do here.
    void hand_over() { owned_ = false; }
    std::vector<std::string> held; // the conversations of this worker's last group

private:
    SendScheduler& s_;
    bool waiter_; // a lock waiter's slot (waiters_), else a send worker's (active_)
    bool owned_ = true;
};

void SendScheduler::give_back(std::vector<std::string>& held, bool waiter) noexcept {
    log_error("send_worker_unwound", {{"conversations", static_cast<long>(held.size())}});
    try {
        std::lock_guard lk(mu_);
        auto& slots = waiter ? waiters_ : active_;
        --slots;
        release(held); // starts a lock waiter when a held run waits
        if (waiter) return;
        // What waits needs a worker: a fresh job takes this slot over.
        try {
            if (queue_.size() > held_runs_ && pool_.submit([this](pqxx::connection_base* n) { drain(n); })) ++slots;
        } catch (const std::exception&) {
        }
    } catch (const std::exception&) { // the lock itself failed: nothing more can be done
    }
}

bool SendScheduler::finish_group(std::vector<Item>& items,
                                 std::vector<std::vector<Outcome<Store::SendResult>>>& results, bool waited) {
    std::vector<Item> held;
    for (std::size_t g = 0; g < items.size(); ++g) {
        // One run's callback that throws must not strand the others' replies.
        try {
            if (results[g].empty()) { // its conversation's row was held: nothing written, try it later
                held.push_back(std::move(items[g]));
                continue;
            }
            finish_run(ctx_, items[g].who, items[g].writes, items[g].rids, std::move(results[g]),
                         std::move(items[g].done), &metrics_);
        } catch (const std::exception& e) {
            log_error("send_finish_failed", {{"conv", write_conv(items[g].writes.front())}, {"err", e.what()}});
        }
    }
    const bool none_held = held.empty();
    if (!none_held) requeue(std::move(held), waited);
    return none_held;
}

std::vector<std::vector<Outcome<Store::SendResult>>> SendScheduler::run_group(pqxx::connection_base& c,
                                                                             const std::vector<Item>& items,
                                                                             std::chrono::milliseconds lock_wait) {
    std::vector<Store::SendRun> runs;
    for (const auto& it : items) runs.push_back({&it.who, &it.writes});
    std::vector<std::vector<Outcome<Store::SendResult>>> results;
    // Lab negative control only (--enable-faults): a crash armed before
    // the insert or the COMMIT fires after the COMMIT instead.
    const bool crash_late = ctx_.faults.enabled() && ctx_.faults.broken("rule.commit_before_crash") &&
                            (ctx_.faults.take_crash("store.before_insert") ||
                             ctx_.faults.take_crash("store.before_commit"));
    try {
        const auto start = std::chrono::steady_clock::now();
        results = ctx_.store.send_group(c, runs, lock_wait);
        if (crash_late) FaultRegistry::crash_now();
        metrics_.observe_send_stage(Metrics::SendStage::statement, seconds_since(start));
    } catch (const std::exception& e) { // never strand a run (or this worker's slot)
        log_error("send_group_failed", {{"err", e.what()}});
        results.clear();
        for (const auto& it : items) results.emplace_back(it.writes.size(), unavailable("retry with the same request"));
    }
    if (items.size() > 1) {
        ++metrics_.send_group_commits;
        metrics_.send_runs_grouped += static_cast<long long>(items.size());
    }
    return results;
}

void SendScheduler::drain(pqxx::connection_base* c) {
    Slot slot(*this, false);
    for (;;) {
        if (c && !c->is_open()) {
            // The connection broke in the last group: a fresh job takes the
            // rest, so the pool replaces the connection first.
            std::lock_guard lk(mu_);
            release(slot.held);
            if (queue_.size() == held_runs_) { // nothing but held runs (the lock waiters'), or nothing
                --active_;
                slot.hand_over();
                return;
            }
            if (pool_.submit([this](pqxx::connection_base* n) { drain(n); })) { // the slot goes with it
                slot.hand_over();
                return;
            }
            c = nullptr; // the pool is stopping: what is left gets UNAVAILABLE here
        }
        auto items = take(slot.held);
        if (items.empty()) { // signed off under the lock
            slot.hand_over();
            return;
        }
        for (const auto& it : items) slot.held.push_back(write_conv(it.writes.front()));
        if (ctx_.faults.enabled() && ctx_.faults.hit("send.after_take") == FaultKind::unavailable) {
            for (auto& it : items)
                finish_run(ctx_, it.who, it.writes, it.rids,
                           std::vector<Outcome<Store::SendResult>>(it.writes.size(), unavailable("injected fault")),
                           std::move(it.done));
            throw std::runtime_error("injected fault: the send worker unwinds"); // Slot gives back
        }
        // The round-trip watchdog bounds one group, not a worker's whole busy spell.
        Watchdog::progress();
        if (!c) {
            for (auto& it : items) send_run_async(ctx_, nullptr, it.who, it.writes, it.rids, std::move(it.done));
            continue;
        }
        auto results = run_group(*c, items, std::chrono::milliseconds(0));
        finish_group(items, results, false);
    }
}

void SendScheduler::wait_for_rows(pqxx::connection_base* c) {
    Slot slot(*this, true);
    bool stay = false; // the last wait got its row
    for (;;) {
        if (c && !c->is_open()) {
            // As a send worker's (drain): a fresh job with a fresh connection.
            std::lock_guard lk(mu_);
            release(slot.held);
            if (held_runs_ > 0 && pool_.submit([this](pqxx::connection_base* n) { wait_for_rows(n); })) {
                slot.hand_over();
                return;
            }
            if (held_runs_ == 0) {
                --waiters_;
                slot.hand_over();
                return;
            }
            c = nullptr; // the pool is stopping: what is left gets UNAVAILABLE here
        }
        auto items = take_held(slot.held, stay);
        if (items.empty()) { // signed off under the lock
            slot.hand_over();
            return;
        }
        Watchdog::progress(); // the watchdog bounds one wait, not the waiter's spell
        if (!c) {
            for (auto& it : items) send_run_async(ctx_, nullptr, it.who, it.writes, it.rids, std::move(it.done));
            continue;
        }
        // One wait: the pool's lock_timeout, and never past the bound of the
        // run held longest (then it is answered UNAVAILABLE, requeue()).
        auto wait = lock_wait_;
        const auto now = std::chrono::steady_clock::now();
        for (const auto& it : items)
            if (it.held)
                wait = std::min(wait, std::chrono::duration_cast<std::chrono::milliseconds>(it.held_since + held_limit_ - now));
        wait = std::max(wait, std::chrono::milliseconds(1));
        auto results = run_group(*c, items, wait);
        stay = finish_group(items, results, true);
    }
}

} // namespace im
