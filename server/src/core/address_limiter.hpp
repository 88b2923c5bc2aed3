// Failures counted per client address in fixed windows, with bounded memory:
// the one limiter behind the WebSocket's failed hellos (--hello-failures) and
// the backend API's failed API keys (--api-auth-failures).
//
// - Addresses are counted under address_key(): IPv4 as itself, IPv6 by its /64.
// - A window opens at an address's first failure and lasts `window`; at
//   `limit` failures inside it the address is limited until it ends.
// - Expiry is amortised: windows open in time order, so they are kept in a
//   queue in that order and every call first drops the windows that are over
//   from its front (each window is dropped once; no sweep of the whole table).
// - At most `capacity` addresses are tracked. When a new address fails with
//   the table full (after expiry), the address whose window opened first is
//   forgotten to make room (counted by evicted()): it is the one closest to
//   being forgotten anyway, and an offender is refused while the table holds
//   it. Only a flood of more than `capacity` distinct addresses a window can
//   push an offender out early; no per-address limit stops such a flood.
//
// Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <unordered_map>

namespace im {

class AddressLimiter {
public:
    using Clock = std::chrono::steady_clock;

    /// The capacity both limiters use (about 100 bytes an address).
    static constexpr std::size_t default_capacity = 65536;

    AddressLimiter(int limit, Clock::duration window = std::chrono::minutes(1),
                   std::size_t capacity = default_capacity);

    /// True while `address` has used up its failures of the current window.
    bool limited(const std::string& address, Clock::time_point now = Clock::now());
    /// Counts one failure of `address`.
    void failed(const std::string& address, Clock::time_point now = Clock::now());

    /// Addresses tracked now (at most the capacity).
    std::size_t size() const;
    /// Addresses forgotten before their window ended to make room.
    std::uint64_t evicted() const;

private:
    struct Window {
        Clock::time_point start;
        int count = 0;
    };
    void expire(Clock::time_point now); // under mu_

    const int limit_;
    const Clock::duration window_;
    const std::size_t capacity_;
    mutable std::mutex mu_;
    std::unordered_map<std::string, Window> windows_;
    // One entry per tracked address, in the order its window opened.
    std::deque<std::pair<Clock::time_point, std::string>> order_;
    std::uint64_t evicted_ = 0;
};

} // namespace im
