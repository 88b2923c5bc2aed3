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
      held_limit_(held_limit), linger_(linger) {
    metrics_.send_workers = static_cast<long long>(max_workers_);
}

bool SendScheduler::submit(Identity who, std::vector<req::Send> sends, std::vector<std::optional<std::string>> rids,
                          RepliesDone done) {
    std::lock_guard lk(mu_);
    if (queue_.size() >= max_queue_) return false;
    queue_.push_back(Item{std::move(who), std::move(sends), std::move(rids), std::move(done)});
    queue_.back().submitted = std::chrono::steady_clock::now();
    metrics_.send_runs_queued = static_cast<long long>(queue_.size());
    // A worker waiting out a held run's back-off takes this one now; a
    // lingering one counts it.
    wake_.notify_all();
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
    for (const auto& conv : done) held_.erase(held_.find(conv));
    done.clear();
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
    const std::size_t last_group = done.size();
    release(done);
    if (linger_.count() > 0 && last_group > 1) {
        const std::size_t want = std::min(max_runs_, queue_.size() + last_group);
        const auto until = std::chrono::steady_clock::now() + linger_;
        if (queue_.size() < want) ++metrics_.send_lingers;
        while (queue_.size() < want && wake_.wait_until(lk, until) != std::cv_status::timeout) {
        }
        Watchdog::progress(); // lingering is not a database round trip
    }
    for (;;) {
        // Oldest first; several runs of one conversation may share the group
        // (the statement runs them in order under one row lock). A run whose
        // conversation was held waits out its back-off.
        const auto now = std::chrono::steady_clock::now();
        auto next_try = std::chrono::steady_clock::time_point::max();
        for (auto it = queue_.begin(); it != queue_.end() && items.size() < max_runs_;) {
            if (it->not_before > now) {
                next_try = std::min(next_try, it->not_before);
                ++it;
                continue;
            }
            if (per_conversation_ && held_.count(it->sends.front().conv)) {
                ++it;
                continue;
            }
            items.push_back(std::move(*it));
            it = queue_.erase(it);
        }
        if (!items.empty() || next_try == std::chrono::steady_clock::time_point::max() || waiting_) break;
        // Only held runs are left: one worker stays to try them again (or
        // to take a new run that submit() announces), the others sign off.
        waiting_ = true;
        wake_.wait_until(lk, next_try);
        waiting_ = false;
        Watchdog::progress(); // waiting is not a database round trip
    }
    const auto taken = std::chrono::steady_clock::now();
    for (const auto& it : items) {
        held_.insert(it.sends.front().conv);
        metrics_.observe_send_stage(Metrics::SendStage::queue,
                                    std::chrono::duration<double>(taken - it.submitted).count());
    }
    metrics_.send_runs_queued = static_cast<long long>(queue_.size());
    // Signing off under the same lock that submit() checks: a run queued
    // after this sees the slot free and schedules a worker of its own. Runs
    // skipped here belong to a group still running (its worker takes them)
    // or wait out a back-off (the waiting worker takes them).
    if (items.empty()) --active_;
    return items;
}

void SendScheduler::requeue(Item it) {
    const auto now = std::chrono::steady_clock::now();
    if (it.held_tries++ == 0) it.held_since = now;
    if (now - it.held_since >= held_limit_) {
        log_warn("send_conversation_held", {{"conv", it.sends.front().conv},
                                            {"ms", static_cast<long>(held_limit_.count())}});
        finish_run(ctx_, it.who, it.sends, it.rids,
                     std::vector<Outcome<Store::SendResult>>(
                         it.sends.size(), unavailable("conversation busy, retry with the same request")),
                     std::move(it.done));
        return;
    }
    it.not_before = now + std::chrono::milliseconds(std::min(200, 10 << std::min(it.held_tries - 1, 5)));
    std::lock_guard lk(mu_);
    queue_.push_front(std::move(it)); // the worker that ran it is still active: it or the waiter takes it
    metrics_.send_runs_queued = static_cast<long long>(queue_.size());
    ++metrics_.send_runs_held;
}

// A send worker's slot (one of active_) and the conversations of its last
// group (in held_), given back however drain() ends: an exception out of a
// group (an allocation, a callback) must not keep them forever, or those
// conversations and the slot would never be scheduled again.
class SendScheduler::Slot {
public:
    explicit Slot(SendScheduler& s) : s_(s) {}
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    ~Slot() {
        if (owned_) s_.give_back(held);
    }
    /// The slot was given back under the lock (take() signed off) or went
    /// with a fresh job: nothing left to do here.
    void hand_over() { owned_ = false; }
    std::vector<std::string> held; // the conversations of this worker's last group

private:
    SendScheduler& s_;
    bool owned_ = true;
};

void SendScheduler::give_back(std::vector<std::string>& held) noexcept {
    log_error("send_worker_unwound", {{"conversations", static_cast<long>(held.size())}});
    try {
        std::lock_guard lk(mu_);
        release(held);
        // What waits needs a worker: a fresh job takes this slot over.
        bool resubmitted = false;
        try {
            resubmitted = !queue_.empty() && pool_.submit([this](pqxx::connection_base* n) { drain(n); });
        } catch (const std::exception&) {
        }
        if (!resubmitted) --active_;
    } catch (const std::exception&) { // the lock itself failed: nothing more can be done
    }
}

void SendScheduler::finish_group(std::vector<Item>& items, std::vector<std::vector<Outcome<Store::SendResult>>>& results) {
    for (std::size_t g = 0; g < items.size(); ++g) {
        // One run's callback that throws must not strand the others' replies.
        try {
            if (results[g].empty()) { // its conversation's row was held: nothing written, try it later
                requeue(std::move(items[g]));
                continue;
            }
            finish_run(ctx_, items[g].who, items[g].sends, items[g].rids, std::move(results[g]),
                         std::move(items[g].done), &metrics_);
        } catch (const std::exception& e) {
            log_error("send_finish_failed", {{"conv", items[g].sends.front().conv}, {"err", e.what()}});
        }
    }
}

void SendScheduler::drain(pqxx::connection_base* c) {
    Slot slot(*this);
    for (;;) {
        if (c && !c->is_open()) {
            // The connection broke in the last group: a fresh job takes the
            // rest, so the pool replaces the connection first.
            std::lock_guard lk(mu_);
            release(slot.held);
            if (queue_.empty()) {
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
        for (const auto& it : items) slot.held.push_back(it.sends.front().conv);
        if (ctx_.faults.enabled() && ctx_.faults.hit("send.after_take") == FaultKind::unavailable) {
            for (auto& it : items)
                finish_run(ctx_, it.who, it.sends, it.rids,
                           std::vector<Outcome<Store::SendResult>>(it.sends.size(), unavailable("injected fault")),
                           std::move(it.done));
            throw std::runtime_error("injected fault: the send worker unwinds"); // Slot gives back
        }
        // The round-trip watchdog bounds one group, not a worker's whole busy spell.
        Watchdog::progress();
        if (!c) {
            for (auto& it : items) send_run_async(ctx_, nullptr, it.who, it.sends, it.rids, std::move(it.done));
            continue;
        }
        std::vector<Store::SendRun> runs;
        for (const auto& it : items) runs.push_back({&it.who, &it.sends});
        std::vector<std::vector<Outcome<Store::SendResult>>> results;
        // Lab negative control only (--enable-faults): a crash armed before
        // the insert or the COMMIT fires after the COMMIT instead.
        const bool crash_late = ctx_.faults.enabled() && ctx_.faults.broken("rule.commit_before_crash") &&
                                (ctx_.faults.take_crash("store.before_insert") ||
                                 ctx_.faults.take_crash("store.before_commit"));
        try {
            const auto start = std::chrono::steady_clock::now();
            results = ctx_.store.send_group(*c, runs);
            if (crash_late) FaultRegistry::crash_now();
            metrics_.observe_send_stage(Metrics::SendStage::statement, seconds_since(start));
        } catch (const std::exception& e) { // never strand a run (or this worker's slot)
            log_error("send_group_failed", {{"err", e.what()}});
            results.clear();
            for (const auto& it : items)
                results.emplace_back(it.sends.size(), unavailable("retry with the same request"));
        }
        if (items.size() > 1) {
            ++metrics_.send_group_commits;
            metrics_.send_runs_grouped += static_cast<long long>(items.size());
        }
        finish_group(items, results);
    }
}

} // namespace im
