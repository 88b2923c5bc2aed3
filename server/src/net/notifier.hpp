// The gateway's fan-out. Two ways in:
//  - the notification bus (bus.hpp): payloads of every gateway's commits; the
//    announced rows are read on this notifier's own connection;
//  - committed_here(): events this gateway has just committed and published,
//    pushed to its own subscribers at once, without a read or the bus's round
//    trip, when each is the next of its conversation.
// Pushes of one conversation go out in seq order: a per-conversation mark of
// what was pushed decides, under one lock, what each path may still push.
// Membership is cached per conversation and dropped on join/leave (seen as
// events) and on settings changes. When the bus connection (or the
// notifier's own) is lost and comes back, every subscriber gets `resync`.
#pragma once

#include "bus/bus.hpp"
#include "core/metrics.hpp"
#include "net/gateway.hpp"
#include "store/store.hpp"

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace im {

class Notifier {
public:
    Notifier(std::string url, std::shared_ptr<Gateway> gw, Store& store, Metrics& metrics);
    /// Subscribes to `bus`; deliveries run on the bus's thread.
    void start(NotificationBus& bus);
    /// Events committed by this gateway, after their payloads went to the bus.
    /// Any thread.
    void committed_here(const std::vector<Event>& events);

private:
    struct ConvState {
        std::int64_t pushed_upto = 0; // highest seq fanned out (0: not known yet)
        std::shared_ptr<const Store::Members> members; // null: load before use
    };

    void deliver(const std::vector<std::string>& payloads);
    void process(pqxx::connection_base& c, const std::vector<std::string>& payloads);
    void fan_out(const std::string& conv, const Store::Members& m, const std::vector<Event>& events); // holds mu_
    void resync();

    std::string url_;
    std::shared_ptr<Gateway> gw_;
    Store& store_;
    Metrics& metrics_;
    std::unique_ptr<pqxx::connection> conn_; // reads rows; only the bus thread uses it
    std::mutex mu_;                          // convs_, and the order of pushes
    std::map<std::string, ConvState> convs_;
};

} // namespace im
