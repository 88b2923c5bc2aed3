#include "memory_store.hpp"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <stdexcept>

namespace im::fuzz {

namespace {

// The messages the production store answers with (clients decide on the code only).
Error not_found() { return {Code::not_found, "no such event"}; }
Error stale() { return {Code::stale_install, "a newer install of this device exists"}; }
Error mismatch() { return {Code::idempotency_mismatch, "cmid already used with different content"}; }
Error expired() { return {Code::original_expired, "the original was purged by retention"}; }

// Fingerprints (contract section 6) without the hash: conv is part of the key
// already. The kind leads, so a send and a recall never match (C3), as the
// server's key lookups check the stored event's kind.
std::string send_fp(const req::Send& s) { return "msg:" + s.body; }
std::string recall_fp(std::int64_t target) { return "recall:" + std::to_string(target); }

// Adds events to a page while they fit (limit, then the frame budget, never
// before the first); false once the page is full: readable events remain.
struct Collector {
    std::int64_t want;
    std::vector<Event> events;
    std::size_t bytes = 0;
    bool take(const Event& ev) {
        const std::size_t n = encoded_size(ev);
        if (static_cast<std::int64_t>(events.size()) >= want || (!events.empty() && bytes + n > page_item_budget))
            return false;
        bytes += n;
        events.push_back(ev);
        return true;
    }
};

} // namespace

bool MemoryStore::Access::can_read(std::int64_t seq) const {
    return std::any_of(periods.begin(), periods.end(), [&](const Period& p) { return seq >= p.from && seq <= p.to; });
}

MemoryStore::Conv* MemoryStore::find(const std::string& conv) {
    auto it = convs_.find(conv);
    return it == convs_.end() ? nullptr : &it->second;
}

MemoryStore::Access MemoryStore::access(const Conv& c, const std::string& user) const {
    Access a;
    auto it = c.periods.find(user);
    if (it == c.periods.end()) return a;
    a.periods = it->second;
    std::int64_t last_to = 0;
    for (const auto& p : a.periods) {
        if (p.to == INT64_MAX) a.open = true;
        else last_to = std::max(last_to, p.to);
    }
    a.head = a.open ? c.next_seq - 1 : last_to;
    return a;
}

Event& MemoryStore::append(Conv& c, const std::string& conv, Event ev) {
    char mid[40];
    std::snprintf(mid, sizeof mid, "00000000-0000-4000-8000-%012lld", static_cast<long long>(++mids_));
    ev.conv = conv;
    ev.seq = c.next_seq++;
    ev.mid = mid;
    ev.ts = now_ms;
    ev.epoch = c.epoch;
    return c.events[ev.seq] = std::move(ev);
}

// ---------------------------------------------------------------- set-up

void MemoryStore::add_device(const std::string& user, const std::string& device, const std::string& token) {
    users_.insert(user);
    devices_[device] = Device{user, token, "", {}};
}

void MemoryStore::add_conv(const std::string& conv, const std::string& kind, const std::vector<std::string>& members) {
    convs_[conv].kind = kind;
    for (const auto& m : members) join(conv, m);
}

void MemoryStore::join(const std::string& conv, const std::string& user) {
    Conv& c = convs_.at(conv);
    Event ev;
    ev.kind = "join";
    ev.sender = user;
    ev.user = user;
    const auto seq = append(c, conv, ev).seq;
    c.periods[user].push_back({seq, INT64_MAX});
}

void MemoryStore::leave(const std::string& conv, const std::string& user) {
    Conv& c = convs_.at(conv);
    auto& ps = c.periods.at(user);
    if (ps.back().to != INT64_MAX) throw std::logic_error("leave: not a member");
    Event ev;
    ev.kind = "leave";
    ev.sender = user;
    ev.user = user;
    ps.back().to = append(c, conv, ev).seq;
}

void MemoryStore::purge(const std::string& conv, std::int64_t before) {
    Conv& c = convs_.at(conv);
    before = std::min(before, c.next_seq);
    for (auto it = c.keys.begin(); it != c.keys.end();) {
        if (it->second.seq < before) {
            c.tombstones.insert(*it);
            it = c.keys.erase(it);
        } else {
            ++it;
        }
    }
    c.events.erase(c.events.begin(), c.events.lower_bound(before));
    c.min_seq = std::max(c.min_seq, before);
}

const Event* MemoryStore::stored(const std::string& conv, std::int64_t seq) const {
    auto c = convs_.find(conv);
    if (c == convs_.end()) return nullptr;
    auto e = c->second.events.find(seq);
    return e == c->second.events.end() ? nullptr : &e->second;
}

void MemoryStore::set_recall_window(const std::string& conv, std::int64_t ms) { convs_.at(conv).recall_window_ms = ms; }

// ---------------------------------------------------------------- hello

Outcome<Identity> MemoryStore::with_install(Identity who) {
    Device& d = devices_.at(who.device);
    if (who.install == d.install) return who;
    if (std::find(d.superseded.begin(), d.superseded.end(), who.install) != d.superseded.end()) return stale();
    if (!d.install.empty()) d.superseded.push_back(d.install);
    d.install = who.install;
    return who;
}

Outcome<Identity> MemoryStore::hello(const req::Hello& r) {
    for (const auto& [id, d] : devices_)
        if (!d.token.empty() && d.token == r.token) return with_install(Identity{d.user, id, r.install, "t:" + id});
    return Error{Code::unauthenticated, "unknown or revoked device token"};
}

Outcome<Identity> MemoryStore::hello_jwt(const std::string& user, const std::string& device,
                                         const std::string& install, std::int64_t exp_ms) {
    if (device.starts_with(Store::backend_device_prefix)) return Error{Code::unauthenticated, "reserved device id"};
    if (!users_.count(user)) return Error{Code::unauthenticated, "unknown user"};
    auto it = devices_.try_emplace(device, Device{user, "", "", {}}).first; // created on its first hello
    if (it->second.user != user) return Error{Code::unauthenticated, "device belongs to another user"};
    return with_install(Identity{user, device, install, "t:" + device, exp_ms});
}

// ---------------------------------------------------------------- send

std::vector<Outcome<Store::SendResult>> MemoryStore::send_run(const Identity& who, const std::vector<req::Send>& run) {
    std::vector<Outcome<Store::SendResult>> out;
    for (const auto& s : run) {
        out.push_back([&]() -> Outcome<Store::SendResult> {
            Conv* c = find(s.conv);
            if (!c) return not_member();
            const Access a = access(*c, who.user);
            if (!a.any()) return not_member();                                      // step 0
            if (auto k = c->keys.find({who.user, s.cmid}); k != c->keys.end()) {    // step 2
                if (k->second.fingerprint != send_fp(s)) return mismatch();
                const Event& ev = c->events.at(k->second.seq);
                return Store::SendResult{Sent{s.conv, ev.seq, ev.mid, true, ev.epoch}, false, ev.ts};
            }
            if (c->tombstones.count({who.user, s.cmid})) return expired();          // step 3
            if (!a.open) return not_member();                                       // step 4
            if (!s.prev.empty() && !c->keys.count({who.user, s.prev}) && !c->tombstones.count({who.user, s.prev}))
                return unavailable("the message named by 'prev' is not committed; send it first"); // step 4a
            Event ev;                                                               // step 5
            ev.kind = "msg";
            ev.sender = who.user;
            ev.body = s.body;
            ev.cmid = s.cmid;
            const Event& e = append(*c, s.conv, std::move(ev));
            c->keys[{who.user, s.cmid}] = Keyed{e.seq, send_fp(s)};
            return Store::SendResult{Sent{s.conv, e.seq, e.mid, false, e.epoch}, false, e.ts};
        }());
    }
    return out;
}

// ---------------------------------------------------------------- reads

Outcome<MemoryStore::Visible> MemoryStore::visible(const Identity& who, const std::string& conv,
                                                  std::optional<std::int64_t> epoch) {
    Conv* c = find(conv);
    if (!c) return not_member();
    Access a = access(*c, who.user);
    if (!a.any()) return not_member(); // C4: nothing else is revealed
    if (epoch && *epoch != c->epoch) return Error{Code::epoch_changed, "epoch is now " + std::to_string(c->epoch)};
    return Visible{c, std::move(a)};
}

Outcome<Page> MemoryStore::sync(const Identity& who, const req::Sync& r) {
    auto v = visible(who, r.conv, r.epoch);
    if (!v) return v.error();
    Conv* c = v->conv;
    const Access& a = v->access;
    if (r.after > a.head) return Error{Code::cursor_ahead, "after is beyond head"};
    Page p;
    p.conv = r.conv;
    p.head = a.head;
    p.min_seq = c->min_seq;
    p.epoch = c->epoch;
    p.trimmed = r.after < c->min_seq - 1;
    Collector col{r.limit, {}};
    for (const auto& per : a.periods) {
        const std::int64_t lo = std::max({r.after + 1, per.from, c->min_seq}), hi = std::min(per.to, a.head);
        for (auto it = c->events.lower_bound(lo); it != c->events.end() && it->first <= hi && !p.has_more; ++it)
            p.has_more = !col.take(it->second);
    }
    p.events = std::move(col.events);
    p.next_after = p.has_more ? p.events.back().seq : a.head;
    return p;
}

Outcome<HistoryPage> MemoryStore::history(const Identity& who, const req::History& r) {
    auto v = visible(who, r.conv, r.epoch);
    if (!v) return v.error();
    Conv* c = v->conv;
    const Access& a = v->access;
    if (r.before > a.head + 1) return Error{Code::cursor_ahead, "before is beyond head + 1"};
    const std::int64_t before = r.before == 0 ? a.head + 1 : r.before;
    HistoryPage p;
    p.conv = r.conv;
    p.head = a.head;
    p.min_seq = c->min_seq;
    p.epoch = c->epoch;
    Collector col{r.limit, {}};
    for (auto per = a.periods.rbegin(); per != a.periods.rend() && !p.has_older; ++per) { // newest first
        const std::int64_t lo = std::max(per->from, c->min_seq), hi = std::min({per->to, a.head, before - 1});
        for (std::int64_t s = hi; s >= lo && !p.has_older; --s)
            if (auto it = c->events.find(s); it != c->events.end()) p.has_older = !col.take(it->second);
    }
    p.events.assign(col.events.rbegin(), col.events.rend());
    const std::int64_t floor_seq = std::max(c->min_seq, a.periods.front().from);
    p.oldest = p.has_older ? p.events.front().seq : std::min(before, floor_seq);
    p.trimmed = !p.has_older && c->min_seq > a.periods.front().from;
    return p;
}

Outcome<Fetched> MemoryStore::fetch(const Identity& who, const req::Fetch& r) {
    auto v = visible(who, r.conv, std::nullopt);
    if (!v) return v.error();
    Conv* c = v->conv;
    const Access& a = v->access;
    if (r.seq > a.head) return not_found();
    if (!a.can_read(r.seq)) return not_member();
    auto it = c->events.find(r.seq);
    if (it == c->events.end()) return not_found();
    return Fetched{it->second};
}

Outcome<ConvList> MemoryStore::convs(const Identity& who, const req::Convs& r) {
    ConvList out;
    std::size_t bytes = 0;
    for (auto it = convs_.upper_bound(r.after); it != convs_.end(); ++it) {
        const Access a = access(it->second, who.user);
        if (!a.any()) continue;
        const Conv& c = it->second;
        ConvInfo ci{it->first, c.kind, a.head, 0, 0, 0, c.epoch, c.min_seq};
        if (auto d = c.delivered.find(who.device); d != c.delivered.end()) ci.delivered = d->second;
        if (auto rd = c.read.find(who.user); rd != c.read.end()) ci.read = rd->second;
        for (auto e = c.events.upper_bound(ci.read); e != c.events.end() && e->first <= a.head; ++e)
            ci.unread += e->second.kind == "msg" && e->second.sender != who.user && a.can_read(e->first) &&
                         !c.recalled.count(e->first);
        const std::size_t n = encoded_size(ci);
        if (static_cast<std::int64_t>(out.convs.size()) >= r.limit || (!out.convs.empty() && bytes + n > page_item_budget)) {
            out.has_more = true;
            break;
        }
        bytes += n;
        out.convs.push_back(std::move(ci));
    }
    out.next_after = out.convs.empty() ? r.after : out.convs.back().conv;
    return out;
}

// ---------------------------------------------------------------- markers

Outcome<MemoryStore::Conv*> MemoryStore::marker(const Identity& who, const std::string& conv, std::int64_t seq) {
    if (devices_.at(who.device).install != who.install) return stale();
    auto v = visible(who, conv, std::nullopt);
    if (!v) return v.error();
    if (seq > v->access.head) return Error{Code::cursor_ahead, "seq is beyond head"};
    return v->conv;
}

Outcome<Acked> MemoryStore::ack(const Identity& who, const req::Ack& r) {
    auto c = marker(who, r.conv, r.seq);
    if (!c) return c.error();
    auto& d = c.value()->delivered[who.device];
    d = std::max(d, r.seq);
    return Acked{r.conv, d};
}

Outcome<ReadOk> MemoryStore::read(const Identity& who, const req::Read& r, Notes& notes) {
    auto c = marker(who, r.conv, r.seq);
    if (!c) return c.error();
    auto& m = c.value()->read[who.user];
    const std::int64_t before = m;
    m = std::max(m, r.seq);
    if (m > before) notes.push_back("r " + r.conv + " " + who.user + " " + who.device + " " + std::to_string(m));
    return ReadOk{r.conv, m};
}

// ---------------------------------------------------------------- recall

Outcome<Recalled> MemoryStore::recall(const Identity& who, const req::Recall& r) {
    auto v = visible(who, r.conv, std::nullopt);
    if (!v) return v.error();
    Conv* c = v->conv;
    const Access& a = v->access;
    if (auto k = c->keys.find({who.user, r.cmid}); k != c->keys.end()) {
        if (k->second.fingerprint != recall_fp(r.target)) return mismatch();
        return Recalled{r.conv, k->second.seq, true};
    }
    if (c->tombstones.count({who.user, r.cmid})) return expired();
    if (r.target > a.head || r.target < c->min_seq) return not_found();
    auto t = c->events.find(r.target);
    if (t == c->events.end()) return not_found();
    if (!a.can_read(r.target)) return not_member();
    if (t->second.kind != "msg") return invalid("only a msg event can be recalled");
    if (t->second.sender != who.user) return Error{Code::not_sender, "only the sender may recall"};
    if (c->recalled.count(r.target)) return Error{Code::already_recalled, "already recalled"};
    if (now_ms > t->second.ts + c->recall_window_ms) return Error{Code::recall_window_expired, "past the recall window"};
    if (!a.open) return not_member();
    Event ev;
    ev.kind = "recall";
    ev.sender = who.user;
    ev.target = r.target;
    ev.cmid = r.cmid;
    const auto seq = append(*c, r.conv, std::move(ev)).seq;
    c->keys[{who.user, r.cmid}] = Keyed{seq, recall_fp(r.target)};
    c->recalled.insert(r.target);
    return Recalled{r.conv, seq, false};
}

} // namespace im::fuzz
