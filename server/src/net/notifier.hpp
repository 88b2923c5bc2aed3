// The gateway's fan-out. Two ways in:
//  - the notification bus (bus.hpp): payloads of every gateway's commits; the
//    announced rows are read on this notifier's own connection;
//  - committed_here(): events this gateway has just committed and published,
//    pushed to its own subscribers at once, without a read or the bus's round
//    trip, when each is the next of its conversation.
// Pushes of one conversation go out in seq order: a per-conversation mark of
// what was pushed decides, under one lock, what each path may still push.
// Membership is cached per conversation and dropped on join/leave (seen as
// events) and on settings changes. The cache is bounded (FanoutCache,
// --fanout-cache-members). An event costs one call into the gateway per
// frame, not one per member: the recipients are the cached sorted list of
// open members, intersected with the subscribed users under one lock
// (Gateway::push_to_users). When the bus connection (or the notifier's own)
// is lost and comes back, every subscriber gets `resync`.
#pragma once

#include "bus/bus.hpp"
#include "core/metrics.hpp"
#include "net/gateway.hpp"
#include "store/store.hpp"

#include <list>
#include <map>
#include <functional>
#include <memory>
#include <unordered_map>
#include <mutex>
#include <string>
#include <vector>

namespace im {

/// The fan-out's state per conversation, bounded: at most `cap` units in
/// all, a conversation costing one plus its membership periods. Past the
/// cap, the least recently used conversations are dropped (never the one in
/// hand): a dropped conversation is as if first seen, so its next delivery
/// reads the announced range and its members again. Not thread-safe (the
/// notifier's lock guards it).
class FanoutCache {
public:
    struct Entry {
        std::int64_t pushed_upto = 0;                  // highest seq fanned out (0: not known yet)
        std::shared_ptr<const Store::Members> members; // null: load before use
        std::vector<std::string> open_users;           // sorted, unique: the members with an open period
        /// An event at or above this seq goes to exactly open_users (every
        /// open period began at or below it and every closed one ended
        /// below it); below, the periods are walked.
        std::int64_t open_from = INT64_MAX;
    };

    explicit FanoutCache(std::size_t cap) : cap_(cap) {}
    /// nullptr when not cached; marks it used.
    Entry* find(const std::string& conv);
    /// Created when missing; marks it used.
    Entry& get(const std::string& conv);
    /// Caches (or, null, drops) the members of `conv`, then trims to the cap.
    void set_members(const std::string& conv, std::shared_ptr<const Store::Members> m);
    void clear();
    std::size_t cost() const { return cost_; }
    std::size_t size() const { return map_.size(); }
    std::size_t evictions() const { return evictions_; }

private:
    struct Slot {
        Entry entry;
        std::list<std::string>::iterator used; // in used_, most recent first
    };
    static std::size_t cost_of(const Entry& e) { return 1 + (e.members ? e.members->periods.size() : 0); }
    void trim(const std::string& keep);

    std::size_t cap_;
    std::size_t cost_ = 0, evictions_ = 0;
    std::unordered_map<std::string, Slot> map_;
    std::list<std::string> used_;
};

class Notifier {
public:
    Notifier(std::string url, std::shared_ptr<Gateway> gw, Store& store, Metrics& metrics);
    /// Subscribes to `bus`; deliveries run on the bus's thread.
    void start(NotificationBus& bus);
    /// start() with another reader of the same payloads (the webhook
    /// deliverer's hints): `tap` sees every batch first, `tap_resync` every
    /// lost subscription. Both on the bus's thread; they must not block.
    void start(NotificationBus& bus, std::function<void(const std::vector<std::string>&)> tap,
               std::function<void()> tap_resync);
    /// Events committed by this gateway, after their payloads went to the bus.
    /// Any thread.
    void committed_here(const std::vector<Event>& events);

private:
    void deliver(const std::vector<std::string>& payloads);
    void process(pqxx::connection_base& c, const std::vector<std::string>& payloads);
    void fan_out(const std::string& conv, const FanoutCache::Entry& st, const std::vector<Event>& events); // holds mu_
    void count_cache(); // holds mu_: the cache's gauges
    void presence(const std::string& payload);                              // "p ..." (contract 13)
    void typing(pqxx::connection_base& c, const std::string& conv, const std::string& user, bool on); // "t ..."
    void resync();

    std::string url_;
    std::shared_ptr<Gateway> gw_;
    Store& store_;
    Metrics& metrics_;
    std::unique_ptr<pqxx::connection> conn_; // reads rows; only the bus thread uses it
    std::mutex mu_;                          // convs_, and the order of pushes
    FanoutCache convs_;
};

} // namespace im
