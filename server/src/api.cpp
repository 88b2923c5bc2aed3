#include "api.hpp"

#include "db_pool.hpp"
#include "log.hpp"
#include "metrics.hpp"

#include <algorithm>
#include <chrono>
#include <future>

namespace im {

Handled error_reply(const Error& e, const std::optional<std::string>& rid) {
    Handled h;
    h.frame = encode_error(e, rid);
    h.code = std::string(code_name(e.code));
    h.close_after = e.code == Code::unauthenticated || e.code == Code::stale_install;
    return h;
}

namespace {

template <class T>
Handled reply(const Outcome<T>& o, const std::optional<std::string>& rid) {
    if (!o) return error_reply(o.error(), rid);
    Handled h;
    h.frame = encode_reply(Reply{o.value()}, rid);
    return h;
}

std::int64_t now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

// Contract section 6, send step 5: the notification is handed to the bus
// after COMMIT and before the reply. A bus that cannot take it turns the
// reply into UNAVAILABLE: the resend is a duplicate and publishes again.
Error unpublished() { return unavailable("committed, but the notification could not be published; resend"); }

} // namespace

namespace {

Handled send_reply(ApiContext& ctx, const Outcome<Store::SendResult>& o, const std::optional<std::string>& rid) {
    if (!o) return error_reply(o.error(), rid);
    // The commit is durable now; this point tests replies lost after it.
    auto f = ctx.faults.hit("api.after_send_commit");
    if (f == FaultKind::unavailable) return error_reply(unavailable("injected fault"), rid);
    Handled h;
    if (o->drop_reply || f == FaultKind::drop_reply) h.code = "DROPPED";
    else h.frame = encode_reply(o->sent, rid);
    return h;
}

} // namespace

namespace {
void finish_sends(ApiContext& ctx, const Identity& who, const std::vector<req::Send>& sends,
                  const std::vector<std::optional<std::string>>& rids, std::vector<Outcome<Store::SendResult>> results,
                  RepliesDone done);
} // namespace

void handle_send_batch(ApiContext& ctx, pqxx::connection_base* conn, const Identity& who,
                       const std::vector<req::Send>& sends, const std::vector<std::optional<std::string>>& rids,
                       RepliesDone done) {
    if (!conn) {
        std::vector<Handled> out;
        for (const auto& rid : rids)
            out.push_back(error_reply(unavailable("database unreachable, retry with the same request"), rid));
        return done(std::move(out));
    }
    auto results = ctx.store.send_batch(*conn, who, sends);
    if (results.empty()) // the conversation's row is held: nothing was written
        results.assign(sends.size(), unavailable("conversation busy, retry with the same request"));
    finish_sends(ctx, who, sends, rids, std::move(results), std::move(done));
}

namespace {

// What follows a run's commit: its own subscribers, the bus, then the replies.
void finish_sends(ApiContext& ctx, const Identity& who, const std::vector<req::Send>& sends,
                  const std::vector<std::optional<std::string>>& rids, std::vector<Outcome<Store::SendResult>> results,
                  RepliesDone done) {
    Notes notes; // a duplicate publishes again (a gateway may have died before it did)
    std::vector<Event> events;
    for (std::size_t i = 0; i < results.size(); ++i) {
        const auto& r = results[i];
        if (!r) continue;
        notes.push_back("e " + r->sent.conv + " " + std::to_string(r->sent.seq));
        Event ev;
        ev.conv = r->sent.conv;
        ev.seq = r->sent.seq;
        ev.mid = r->sent.mid;
        ev.kind = "msg";
        ev.sender = who.user;
        ev.body = sends[i].body;
        ev.cmid = sends[i].cmid;
        ev.ts = r->ts;
        ev.epoch = r->sent.epoch;
        events.push_back(std::move(ev));
    }
    // Own subscribers first: no read, no wait for the bus's round trip.
    if (ctx.committed && !events.empty()) ctx.committed(events);
    // Contract section 6, send step 5: the replies only after the events'
    // notification was handed to the bus.
    auto complete = [&ctx, results = std::move(results), rids, done = std::move(done)](bool published) mutable {
        if (!published)
            for (auto& r : results)
                if (r) r = unpublished();
        std::vector<Handled> out;
        out.reserve(results.size());
        for (std::size_t i = 0; i < results.size(); ++i) out.push_back(send_reply(ctx, results[i], rids[i]));
        done(std::move(out));
    };
    if (notes.empty() || !ctx.bus) return complete(true);
    ctx.bus->publish(std::move(notes), std::move(complete));
}

} // namespace

SendCombiner::SendCombiner(ApiContext& ctx, DbPool& pool, Metrics& metrics, std::size_t max_runs,
                           std::size_t max_workers, std::size_t max_queue, bool per_conversation,
                           std::chrono::milliseconds held_limit)
    : ctx_(ctx), pool_(pool), metrics_(metrics), max_runs_(std::max<std::size_t>(1, max_runs)),
      max_workers_(std::max<std::size_t>(1, max_workers)), max_queue_(max_queue), per_conversation_(per_conversation),
      held_limit_(held_limit) {
    metrics_.send_workers = static_cast<long long>(max_workers_);
}

bool SendCombiner::submit(Identity who, std::vector<req::Send> sends, std::vector<std::optional<std::string>> rids,
                          RepliesDone done) {
    std::lock_guard lk(mu_);
    if (queue_.size() >= max_queue_) return false;
    queue_.push_back(Item{std::move(who), std::move(sends), std::move(rids), std::move(done)});
    metrics_.send_runs_queued = static_cast<long long>(queue_.size());
    wake_.notify_one(); // a worker waiting out a held run's back-off takes this one now
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

void SendCombiner::release(std::vector<std::string>& done) {
    for (const auto& conv : done) held_.erase(held_.find(conv));
    done.clear();
}

std::vector<SendCombiner::Item> SendCombiner::take(std::vector<std::string>& done) {
    std::vector<Item> items;
    std::unique_lock lk(mu_);
    release(done);
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
    for (const auto& it : items) held_.insert(it.sends.front().conv);
    metrics_.send_runs_queued = static_cast<long long>(queue_.size());
    // Signing off under the same lock that submit() checks: a run queued
    // after this sees the slot free and schedules a worker of its own. Runs
    // skipped here belong to a group still running (its worker takes them)
    // or wait out a back-off (the waiting worker takes them).
    if (items.empty()) --active_;
    return items;
}

void SendCombiner::requeue(Item it) {
    const auto now = std::chrono::steady_clock::now();
    if (it.held_tries++ == 0) it.held_since = now;
    if (now - it.held_since >= held_limit_) {
        log_warn("send_conversation_held", {{"conv", it.sends.front().conv},
                                            {"ms", static_cast<long>(held_limit_.count())}});
        finish_sends(ctx_, it.who, it.sends, it.rids,
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

void SendCombiner::drain(pqxx::connection_base* c) {
    std::vector<std::string> held; // the conversations of this worker's last group
    for (;;) {
        if (c && !c->is_open()) {
            // The connection broke in the last group: a fresh job takes the
            // rest, so the pool replaces the connection first.
            std::lock_guard lk(mu_);
            release(held);
            if (queue_.empty()) {
                --active_;
                return;
            }
            if (pool_.submit([this](pqxx::connection_base* n) { drain(n); })) return; // the slot goes with it
            c = nullptr; // the pool is stopping: what is left gets UNAVAILABLE here
        }
        auto items = take(held);
        if (items.empty()) return;
        for (const auto& it : items) held.push_back(it.sends.front().conv);
        // The round-trip watchdog bounds one group, not a worker's whole busy spell.
        Watchdog::progress();
        if (!c) {
            for (auto& it : items) handle_send_batch(ctx_, nullptr, it.who, it.sends, it.rids, std::move(it.done));
            continue;
        }
        std::vector<Store::SendRun> runs;
        for (const auto& it : items) runs.push_back({&it.who, &it.sends});
        std::vector<std::vector<Outcome<Store::SendResult>>> results;
        try {
            results = ctx_.store.send_runs(*c, runs);
        } catch (const std::exception& e) { // never strand a run (or this worker's slot)
            log_error("send_group_failed", {{"err", e.what()}});
            for (const auto& it : items)
                results.emplace_back(it.sends.size(), unavailable("retry with the same request"));
        }
        if (items.size() > 1) {
            ++metrics_.send_group_commits;
            metrics_.send_runs_grouped += static_cast<long long>(items.size());
        }
        for (std::size_t g = 0; g < items.size(); ++g) {
            if (results[g].empty()) { // its conversation's row was held: nothing written, try it later
                requeue(std::move(items[g]));
                continue;
            }
            finish_sends(ctx_, items[g].who, items[g].sends, items[g].rids, std::move(results[g]),
                         std::move(items[g].done));
        }
    }
}

std::vector<Handled> handle_send_batch(ApiContext& ctx, pqxx::connection_base* conn, const Identity& who,
                                       const std::vector<req::Send>& sends,
                                       const std::vector<std::optional<std::string>>& rids) {
    auto promise = std::make_shared<std::promise<std::vector<Handled>>>();
    auto result = promise->get_future();
    handle_send_batch(ctx, conn, who, sends, rids, [promise](std::vector<Handled> hs) { promise->set_value(std::move(hs)); });
    return result.get();
}

Outcome<jwt::Claims> check_jwt(const ApiContext& ctx, const std::string& token) {
    if (!ctx.jwt) return Error{Code::unauthenticated, "signed tokens are not enabled on this server"};
    const auto now_s = std::chrono::duration_cast<std::chrono::seconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
    auto v = ctx.jwt->verify(token, now_s);
    if (auto* r = std::get_if<jwt::Refusal>(&v)) {
        log_info("jwt_refused", {{"reason", r->reason}});
        return Error{Code::unauthenticated, "invalid token"};
    }
    return std::get<jwt::Claims>(std::move(v));
}

Handled handle_request(ApiContext& ctx, pqxx::connection_base* conn, const std::optional<Identity>& who,
                       const Request& req, const std::optional<std::string>& rid) {
    if (!conn) return error_reply(unavailable("database unreachable, retry with the same request"), rid);
    auto& c = *conn;
    return std::visit(
        [&](const auto& r) -> Handled {
            using T = std::decay_t<decltype(r)>;
            if constexpr (std::is_same_v<T, req::Hello>) {
                std::optional<Outcome<Identity>> o;
                if (jwt::looks_like_jwt(r.token)) {
                    auto claims = check_jwt(ctx, r.token);
                    if (!claims) return error_reply(claims.error(), rid);
                    o = ctx.store.hello_jwt(c, claims->sub, claims->device, r.install, claims->exp_ms);
                } else {
                    o = ctx.store.hello(c, r);
                }
                if (!*o) return error_reply(o->error(), rid);
                Handled h;
                h.frame = encode_reply(Welcome{(*o)->user, (*o)->device, ctx.gateway_id, now_ms()}, rid);
                h.identity = o->value();
                return h;
            } else if constexpr (std::is_same_v<T, req::Send>) {
                return handle_send_batch(ctx, conn, *who, {r}, {rid}).front();
            } else if constexpr (std::is_same_v<T, req::Sync>) {
                return reply(ctx.store.sync(c, *who, r), rid);
            } else if constexpr (std::is_same_v<T, req::Ack>) {
                return reply(ctx.store.ack(c, *who, r), rid);
            } else if constexpr (std::is_same_v<T, req::Read> || std::is_same_v<T, req::Recall>) {
                if (!who) return error_reply({Code::unauthenticated, "send hello first"}, rid);
                auto promise = std::make_shared<std::promise<Handled>>();
                auto result = promise->get_future();
                handle_request(ctx, conn, who, req, rid, [promise](Handled h) { promise->set_value(std::move(h)); });
                return result.get();
            } else if constexpr (std::is_same_v<T, req::Convs>) {
                return reply(ctx.store.convs(c, *who, r), rid);
            } else if constexpr (std::is_same_v<T, req::History>) {
                return reply(ctx.store.history(c, *who, r), rid);
            } else if constexpr (std::is_same_v<T, req::Fetch>) {
                return reply(ctx.store.fetch(c, *who, r), rid);
            } else {
                // sub is answered on the I/O thread; nothing else reaches here.
                return error_reply(invalid("unexpected request"), rid);
            }
        },
        req);
}

namespace {

// The recall is durable (and published) now; this point tests replies lost after it.
Handled recall_reply(ApiContext& ctx, const Outcome<Recalled>& o, const std::optional<std::string>& rid) {
    auto f = ctx.faults.hit("api.after_recall_commit");
    if (f == FaultKind::unavailable) return error_reply(unavailable("injected fault"), rid);
    if (f == FaultKind::drop_reply) {
        Handled h;
        h.code = "DROPPED";
        return h;
    }
    return reply(o, rid);
}

} // namespace

void handle_request(ApiContext& ctx, pqxx::connection_base* conn, const std::optional<Identity>& who,
                    const Request& req, const std::optional<std::string>& rid, std::function<void(Handled)> done) {
    // read and recall commit, then hand their notification to the bus; the
    // worker is free once they committed (the bus answers on its own thread).
    if (conn && who) {
        if (const auto* r = std::get_if<req::Read>(&req)) {
            Notes notes;
            auto o = ctx.store.read(*conn, *who, *r, notes);
            Handled h = reply(o, rid);
            if (notes.empty() || !ctx.bus) return done(std::move(h));
            // A lost hint is healed by the next convs: the reply stands either way.
            ctx.bus->publish(std::move(notes),
                             [h = std::move(h), done = std::move(done)](bool) mutable { done(std::move(h)); });
            return;
        }
        if (const auto* r = std::get_if<req::Recall>(&req)) {
            auto o = ctx.store.recall(*conn, *who, *r);
            if (!o) return done(error_reply(o.error(), rid));
            if (!ctx.bus) return done(recall_reply(ctx, o, rid));
            Notes notes{"e " + o->conv + " " + std::to_string(o->seq)};
            ctx.bus->publish(std::move(notes), [&ctx, o, rid, done = std::move(done)](bool published) {
                done(published ? recall_reply(ctx, o, rid) : error_reply(unpublished(), rid));
            });
            return;
        }
    }
    done(handle_request(ctx, conn, who, req, rid));
}

} // namespace im
