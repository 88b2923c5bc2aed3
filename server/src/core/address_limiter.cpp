#include "core/address_limiter.hpp"

#include "core/address.hpp"

namespace im {

AddressLimiter::AddressLimiter(int limit, Clock::duration window, std::size_t capacity)
    : limit_(limit), window_(window), capacity_(capacity < 1 ? 1 : capacity) {}

// Invariant: windows_ and order_ hold the same addresses, order_ sorted by
// window start. A window is only reopened once it is over, and every call
// drops the windows that are over first, so a reopened address never has a
// stale entry left in order_.
void AddressLimiter::expire(Clock::time_point now) {
    while (!order_.empty() && now - order_.front().first >= window_) {
        windows_.erase(order_.front().second);
        order_.pop_front();
    }
}

bool AddressLimiter::limited(const std::string& address, Clock::time_point now) {
    const auto key = address_key(address);
    std::lock_guard lk(mu_);
    expire(now);
    auto it = windows_.find(key);
    return it != windows_.end() && it->second.count >= limit_;
}

void AddressLimiter::failed(const std::string& address, Clock::time_point now) {
    auto key = address_key(address);
    std::lock_guard lk(mu_);
    expire(now);
    if (auto it = windows_.find(key); it != windows_.end()) {
        if (it->second.count < limit_) ++it->second.count;
        return;
    }
    if (windows_.size() >= capacity_) {
        windows_.erase(order_.front().second);
        order_.pop_front();
        ++evicted_;
    }
    // A caller's `now` taken before another caller's may arrive after it:
    // the queue keeps its order by never starting a window before the last.
    if (!order_.empty() && now < order_.back().first) now = order_.back().first;
    windows_.emplace(key, Window{now, 1});
    order_.emplace_back(now, std::move(key));
}

std::size_t AddressLimiter::size() const {
    std::lock_guard lk(mu_);
    return windows_.size();
}

std::uint64_t AddressLimiter::evicted() const {
    std::lock_guard lk(mu_);
    return evicted_;
}

} // namespace im
