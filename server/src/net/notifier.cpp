#include "net/notifier.hpp"

#include "store/db_pool.hpp"
#include "core/log.hpp"

#include <pqxx/pqxx>

#include <chrono>
#include <sstream>

namespace im {

namespace {

std::int64_t now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

// A client that missed more than this many events of one conversation sees
// a seq gap and syncs; the fan-out does not replay a long backlog.
constexpr std::int64_t max_catch_up = 256;

} // namespace

Notifier::Notifier(std::string url, std::shared_ptr<Gateway> gw, Store& store, Metrics& metrics)
    : url_(std::move(url)), gw_(std::move(gw)), store_(store), metrics_(metrics) {}

void Notifier::start(NotificationBus& bus) {
    bus.subscribe({[this](const std::vector<std::string>& p) { deliver(p); }, [this] { resync(); }});
}

void Notifier::resync() {
    {
        std::lock_guard lk(mu_);
        convs_.clear();
    }
    gw_->recheck_tokens(); // revocations announced while the bus was away
    if (gw_->config().lab.no_resync) return; // the lab's negative control of 10-notify-loss-resync
    gw_->resync_all();
}

void Notifier::committed_here(const std::vector<Event>& events) {
    if (!gw_->has_any_subscriber()) return;
    std::lock_guard lk(mu_);
    for (const auto& ev : events) {
        // Only the next event of a conversation whose members are known:
        // anything else (an earlier seq still on its way, a first sight of
        // the conversation) is left to the bus delivery, which reads ranges.
        auto it = convs_.find(ev.conv);
        if (it == convs_.end() || !it->second.members || it->second.pushed_upto != ev.seq - 1) continue;
        fan_out(ev.conv, *it->second.members, {ev});
        it->second.pushed_upto = ev.seq;
        ++metrics_.pushes_direct;
    }
}

void Notifier::deliver(const std::vector<std::string>& payloads) {
    // Revocations first, whether or not anyone subscribed: they close
    // connections, subscribed or not.
    for (const auto& p : payloads)
        if (p.rfind("d - ", 0) == 0) gw_->close_device(p.substr(4));
    // Lab: crash before any of these notifications is pushed, or lose them
    // as a lost LISTEN session would (subscribers are told to resync).
    if (gw_->faults().hit("notify.before_publish") == FaultKind::unavailable) {
        log_warn("notify_fault_lost", {{"payloads", static_cast<long>(payloads.size())}});
        return resync();
    }
    if (!gw_->has_any_subscriber()) {
        std::lock_guard lk(mu_);
        convs_.clear(); // nobody to push to: nothing to keep in order
        return;
    }
    try {
        if (!conn_ || !conn_->is_open()) conn_ = open_connection(url_, "imserver-fanout-" + gw_->config().gateway_id);
        // A frozen database must not hang the bus thread (nor SIGTERM).
        Watchdog::Watch watch(gw_->pool().watchdog(), *conn_);
        process(*conn_, payloads);
    } catch (const std::exception& e) {
        // These payloads' pushes are lost: every subscriber catches up by sync.
        log_warn("fanout_read_failed", {{"err", e.what()}});
        conn_.reset();
        resync();
    }
}

void Notifier::fan_out(const std::string& conv, const Store::Members& m, const std::vector<Event>& events) {
    std::map<std::string, std::int64_t> hint_heads; // large conversations: one hint per user
    std::int64_t epoch = 1;
    const bool full = m.full || gw_->faults().broken("rule.push_hint"); // the latter: lab negative control only
    for (const auto& ev : events) {
        epoch = ev.epoch;
        // Encoded once; the same frame goes to every subscribed connection.
        auto frame = full ? std::make_shared<const std::string>(encode_event_push(ev)) : nullptr;
        for (const auto& p : m.periods) {
            if (ev.seq < p.from || ev.seq > p.to || !gw_->has_subscribers(p.user)) continue;
            if (frame) {
                gw_->push_to_user(p.user, frame);
                ++metrics_.pushes_event;
            } else {
                hint_heads[p.user] = std::max(hint_heads[p.user], ev.seq);
            }
        }
    }
    for (const auto& [user, head] : hint_heads) {
        gw_->push_to_user(user, std::make_shared<const std::string>(encode_hint(conv, head, epoch, std::nullopt)));
        ++metrics_.pushes_hint;
    }
}

void Notifier::process(pqxx::connection_base& c, const std::vector<std::string>& payloads) {
    // Coalesce: per conversation one read of the committed range above what
    // was already pushed (all of it committed: seq order is commit order).
    std::map<std::string, std::pair<std::int64_t, std::int64_t>> ranges;
    struct ReadMove { std::string conv, user, device; std::int64_t read; };
    std::vector<ReadMove> reads;
    std::vector<std::string> changed;
    for (const auto& p : payloads) {
        std::istringstream in(p);
        std::string kind, conv;
        in >> kind >> conv;
        if (kind == "e") {
            std::int64_t seq = 0, from = 0;
            in >> seq;
            if (!(in >> from) || from > seq) from = seq; // a collapsed run carries its lowest seq too
            auto [it, fresh] = ranges.try_emplace(conv, from, seq);
            if (!fresh) {
                it->second.first = std::min(it->second.first, from);
                it->second.second = std::max(it->second.second, seq);
            }
        } else if (kind == "r") {
            ReadMove m;
            m.conv = conv;
            in >> m.user >> m.device >> m.read;
            reads.push_back(std::move(m));
        } else if (kind == "x" || kind == "m") {
            std::lock_guard lk(mu_);
            auto it = convs_.find(conv);
            if (it != convs_.end()) it->second.members.reset(); // settings or epoch changed
            if (kind == "x") changed.push_back(conv);
        }
    }
    for (auto [conv, range] : ranges) {
        bool reload = false;
        {
            std::lock_guard lk(mu_);
            auto& st = convs_[conv];
            if (st.pushed_upto > 0) range.first = st.pushed_upto + 1;
            range.first = std::max(range.first, range.second - max_catch_up + 1);
            if (range.first > range.second) continue; // already pushed (here, directly)
            // Skipped events may hold a join or leave: the cache is only
            // good for a range that follows what was pushed.
            reload = !st.members || st.pushed_upto == 0 || range.first != st.pushed_upto + 1;
        }
        auto events = store_.push_events(c, conv, range.first, range.second);
        for (const auto& ev : events) {
            metrics_.notify_lag_ms = std::max<std::int64_t>(0, now_ms() - ev.ts);
            reload = reload || ev.kind == "join" || ev.kind == "leave";
        }
        // Read after the events: never older than any of them.
        std::shared_ptr<const Store::Members> fresh;
        if (reload) fresh = std::make_shared<const Store::Members>(store_.push_members(c, conv));
        std::lock_guard lk(mu_);
        auto& st = convs_[conv];
        if (fresh) st.members = fresh;
        if (!st.members) continue;
        std::vector<Event> todo;
        for (auto& ev : events)
            if (ev.seq > st.pushed_upto) todo.push_back(std::move(ev));
        if (todo.empty()) continue;
        fan_out(conv, *st.members, todo);
        st.pushed_upto = todo.back().seq;
    }
    for (const auto& m : reads) {
        if (!gw_->has_subscribers(m.user)) continue;
        auto b = store_.load_push(c, m.conv, 1, 0);
        if (!b) continue;
        gw_->push_to_user(m.user,
                          std::make_shared<const std::string>(encode_hint(m.conv, b->head_for(m.user), b->epoch, m.read)),
                          m.device);
        ++metrics_.pushes_hint;
    }
    for (const auto& conv : changed) {
        auto b = store_.load_push(c, conv, 1, 0);
        if (!b) continue;
        auto frame = std::make_shared<const std::string>(encode_hint(conv, b->head, b->epoch, std::nullopt));
        for (const auto& p : b->periods) {
            if (p.to != INT64_MAX || !gw_->has_subscribers(p.user)) continue;
            gw_->push_to_user(p.user, frame);
            ++metrics_.pushes_hint;
        }
    }
}

} // namespace im
