#include "core/write_limiter.hpp"

#include <algorithm>
#include <cmath>

namespace im {

WriteLimiter::WriteLimiter(double rate, double burst) : rate_(rate), burst_(std::max(1.0, burst)) {}

double WriteLimiter::level(const Bucket& b, Clock::time_point now) const {
    const double elapsed = std::chrono::duration<double>(now - b.at).count();
    return std::min(burst_, b.tokens + std::max(0.0, elapsed) * rate_);
}

void WriteLimiter::sweep(Clock::time_point now) {
    for (auto it = buckets_.begin(); it != buckets_.end();) {
        if (level(it->second, now) >= burst_) it = buckets_.erase(it);
        else ++it;
    }
    sweep_at_ = std::max<std::size_t>(1024, 2 * buckets_.size());
}

std::int64_t WriteLimiter::take(const std::string& user, Clock::time_point now) {
    if (unlimited()) return 0;
    std::lock_guard lk(mu_);
    auto it = buckets_.find(user);
    if (it == buckets_.end()) {
        if (buckets_.size() >= sweep_at_) sweep(now);
        buckets_.emplace(user, Bucket{burst_ - 1, now});
        return 0;
    }
    const double tokens = level(it->second, now);
    if (tokens >= 1) {
        it->second = Bucket{tokens - 1, now};
        return 0;
    }
    // Not taken: the bucket is left as it was (its time is not moved, so the
    // refill is not lost). At least 1 ms, so 0 always means "taken".
    return std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil((1 - tokens) / rate_ * 1000)));
}

std::size_t WriteLimiter::size() const {
    std::lock_guard lk(mu_);
    return buckets_.size();
}

} // namespace im
