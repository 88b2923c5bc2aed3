#include "net/notifier.hpp"

#include "store/db_pool.hpp"
#include "core/log.hpp"

#include <pqxx/pqxx>

#include <algorithm>
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

FanoutCache::Entry* FanoutCache::find(const std::string& conv) {
    auto it = map_.find(conv);
    if (it == map_.end()) return nullptr;
    used_.splice(used_.begin(), used_, it->second.used);
    return &it->second.entry;
}

FanoutCache::Entry& FanoutCache::get(const std::string& conv) {
    if (auto* e = find(conv)) return *e;
    used_.push_front(conv);
    auto& slot = map_[conv];
    slot.used = used_.begin();
    cost_ += cost_of(slot.entry);
    trim(conv);
    return slot.entry;
}

void FanoutCache::set_members(const std::string& conv, std::shared_ptr<const Store::Members> m) {
    Entry& e = get(conv);
    cost_ -= cost_of(e);
    e.members = std::move(m);
    e.open_users.clear();
    e.open_from = INT64_MAX;
    if (e.members) {
        std::int64_t from = 0;
        for (const auto& p : e.members->periods) {
            if (p.to == INT64_MAX) {
                e.open_users.push_back(p.user);
                from = std::max(from, p.from);
            } else {
                from = std::max(from, p.to + 1);
            }
        }
        std::sort(e.open_users.begin(), e.open_users.end());
        e.open_users.erase(std::unique(e.open_users.begin(), e.open_users.end()), e.open_users.end());
        e.open_from = from;
    }
    cost_ += cost_of(e);
    trim(conv);
}

void FanoutCache::trim(const std::string& keep) {
    while (cost_ > cap_ && map_.size() > 1) {
        auto victim = std::prev(used_.end());
        if (*victim == keep) break; // only the one in hand is left to drop
        auto it = map_.find(*victim);
        cost_ -= cost_of(it->second.entry);
        map_.erase(it);
        used_.erase(victim);
        ++evictions_;
    }
}

void FanoutCache::clear() {
    map_.clear();
    used_.clear();
    cost_ = 0;
}

Notifier::Notifier(std::string url, std::shared_ptr<Gateway> gw, Store& store, Metrics& metrics)
    : url_(std::move(url)), gw_(std::move(gw)), store_(store), metrics_(metrics),
      convs_(static_cast<std::size_t>(gw_->config().fanout_cache_members)) {}

void Notifier::count_cache() {
    metrics_.fanout_cache_members = static_cast<long long>(convs_.cost());
    metrics_.fanout_cache_evictions = static_cast<long long>(convs_.evictions());
}

void Notifier::start(NotificationBus& bus) { start(bus, {}, {}); }

void Notifier::start(NotificationBus& bus, std::function<void(const std::vector<std::string>&)> tap,
                     std::function<void()> tap_resync) {
    bus.subscribe({[this, tap](const std::vector<std::string>& p) {
                       if (tap) tap(p);
                       deliver(p);
                   },
                   [this, tap_resync] {
                       if (tap_resync) tap_resync();
                       resync();
                   }});
}

void Notifier::resync() {
    {
        std::lock_guard lk(mu_);
        convs_.clear();
        count_cache();
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
        auto* st = convs_.find(ev.conv);
        if (!st || !st->members || st->pushed_upto != ev.seq - 1) continue;
        fan_out(ev.conv, *st, {ev});
        st->pushed_upto = ev.seq;
        ++metrics_.pushes_direct;
    }
}

void Notifier::deliver(const std::vector<std::string>& payloads) {
    // Revocations first, whether or not anyone subscribed: they close
    // connections, subscribed or not.
    for (const auto& p : payloads)
        if (p.rfind("d - ", 0) == 0) gw_->close_device(p.substr(4));
    // Presence changes go to watching connections, subscribed or not (one
    // change per line, several lines per payload).
    for (const auto& p : payloads) {
        if (p.rfind("p ", 0) != 0) continue;
        for (std::size_t at = 0; at < p.size();) {
            auto end = p.find('\n', at);
            if (end == std::string::npos) end = p.size();
            presence(p.substr(at, end - at));
            at = end + 1;
        }
    }
    // Lab: crash before any of these notifications is pushed, or lose them
    // as a lost LISTEN session would (subscribers are told to resync).
    if (gw_->faults().hit("notify.before_publish") == FaultKind::unavailable) {
        log_warn("notify_fault_lost", {{"payloads", static_cast<long>(payloads.size())}});
        return resync();
    }
    if (!gw_->has_any_subscriber()) {
        std::lock_guard lk(mu_);
        convs_.clear(); // nobody to push to: nothing to keep in order
        count_cache();
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

void Notifier::presence(const std::string& payload) {
    std::istringstream in(payload.substr(2));
    PresenceInfo p;
    int online = 0;
    std::string last_seen;
    std::int64_t version = 0;
    if (!(in >> p.user >> online >> last_seen >> version)) return;
    p.online = online == 1;
    if (last_seen != "-") p.last_seen = std::stoll(last_seen);
    gw_->push_presence(p, version);
}

void Notifier::typing(pqxx::connection_base& c, const std::string& conv, const std::string& user, bool on) {
    // The recipients: the cached open members when the fan-out has them,
    // else one read (not cached: the fan-out's cache follows its events).
    // Whether the conversation is small enough (push_full_max) was decided
    // by the typist's gateway with a fresh read: only then is it published.
    std::vector<std::string> to;
    bool known = false;
    {
        std::lock_guard lk(mu_);
        if (auto* st = convs_.find(conv); st && st->members) {
            to = st->open_users;
            known = true;
        }
    }
    if (!known) {
        for (const auto& p : store_.push_members(c, conv).periods)
            if (p.to == INT64_MAX) to.push_back(p.user);
        std::sort(to.begin(), to.end());
        to.erase(std::unique(to.begin(), to.end()), to.end());
    }
    to.erase(std::remove(to.begin(), to.end(), user), to.end()); // the others only
    auto frame = std::make_shared<const std::string>(encode_typing_push(conv, user, on));
    metrics_.pushes_typing += static_cast<long long>(gw_->push_to_users(to, frame));
}

void Notifier::fan_out(const std::string& conv, const FanoutCache::Entry& st, const std::vector<Event>& events) {
    const Store::Members& m = *st.members;
    const bool full = m.full || gw_->faults().broken("rule.push_hint"); // the latter: lab negative control only
    // The members who may read `seq`, sorted: the cached open members for
    // every event at or above open_from (nearly all), else a walk of the periods.
    std::vector<std::string> walked;
    auto readers = [&](std::int64_t seq) -> const std::vector<std::string>& {
        if (seq >= st.open_from) return st.open_users;
        walked.clear();
        for (const auto& p : m.periods)
            if (seq >= p.from && seq <= p.to) walked.push_back(p.user);
        std::sort(walked.begin(), walked.end());
        walked.erase(std::unique(walked.begin(), walked.end()), walked.end());
        return walked;
    };
    if (full) {
        for (const auto& ev : events) {
            // Encoded once; the same frame goes to every subscribed connection.
            auto frame = std::make_shared<const std::string>(encode_event_push(ev));
            metrics_.pushes_event += static_cast<long long>(gw_->push_to_users(readers(ev.seq), frame));
        }
        return;
    }
    // Large conversations: one hint per user, with the newest seq it may
    // read. When the newest event is above open_from, every open member's
    // hint is the same frame; a former member whose period ended inside
    // these events gets its own.
    const Event& last = events.back();
    std::map<std::string, std::int64_t> other_heads;
    if (last.seq < st.open_from || events.front().seq < st.open_from) {
        for (const auto& ev : events)
            for (const auto& u : readers(ev.seq)) other_heads[u] = std::max(other_heads[u], ev.seq);
        if (last.seq >= st.open_from) // every open member reads `last`: the shared frame below
            for (const auto& u : st.open_users) other_heads.erase(u);
    }
    if (last.seq >= st.open_from) {
        auto frame = std::make_shared<const std::string>(encode_hint(conv, last.seq, last.epoch, std::nullopt));
        metrics_.pushes_hint += static_cast<long long>(gw_->push_to_users(st.open_users, frame));
    }
    for (const auto& [user, head] : other_heads) {
        if (!gw_->has_subscribers(user)) continue;
        gw_->push_to_user(user, std::make_shared<const std::string>(encode_hint(conv, head, last.epoch, std::nullopt)));
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
        } else if (kind == "t") {
            std::string user, on;
            if (in >> user >> on) typing(c, conv, user, on == "1");
        } else if (kind == "x" || kind == "m") {
            std::lock_guard lk(mu_);
            if (convs_.find(conv)) convs_.set_members(conv, nullptr); // settings or epoch changed
            if (kind == "x") changed.push_back(conv);
        }
    }
    for (auto [conv, range] : ranges) {
        bool reload = false;
        {
            std::lock_guard lk(mu_);
            auto& st = convs_.get(conv);
            count_cache();
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
        if (fresh) convs_.set_members(conv, fresh);
        count_cache();
        auto& st = convs_.get(conv);
        if (!st.members) continue;
        std::vector<Event> todo;
        for (auto& ev : events)
            if (ev.seq > st.pushed_upto) todo.push_back(std::move(ev));
        if (todo.empty()) continue;
        fan_out(conv, st, todo);
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
