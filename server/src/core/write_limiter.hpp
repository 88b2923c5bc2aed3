// The per-user token buckets of sends, edits and reactions (server.md,
// "Rate limits and moderation": --send-rate per second, --send-burst).
//
// - One bucket per user, in this gateway's memory (the spec's "token bucket
//   per gateway"): a user connected to two gateways may write up to twice
//   the rate. Nothing of it touches the database: a limited request is
//   answered RATE_LIMITED with retry_ms on the I/O thread, before any
//   worker or statement (docs/operations.md, "Rate limits").
// - A bucket holds at most `burst` tokens and refills at `rate` a second;
//   each write takes one. A user without a bucket has a full one.
// - Memory: a bucket that has refilled to full is the same as none, so when
//   the table has doubled since the last sweep the full ones are dropped
//   (amortised, O(1) a call). What stays is the users who wrote in the last
//   burst / rate seconds (3 s by default).
// - rate 0: unlimited (no table at all).
//
// Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

namespace im {

class WriteLimiter {
public:
    using Clock = std::chrono::steady_clock;

    WriteLimiter(double rate, double burst);

    /// 0 when `user` may write at `now` (one token is taken); else the ms
    /// until a token is there (nothing is taken).
    std::int64_t take(const std::string& user, Clock::time_point now = Clock::now());

    /// Users with a bucket not (known to be) full.
    std::size_t size() const;
    bool unlimited() const { return rate_ <= 0; }

private:
    struct Bucket {
        double tokens;
        Clock::time_point at;
    };
    double level(const Bucket& b, Clock::time_point now) const;
    void sweep(Clock::time_point now); // under mu_

    const double rate_;
    const double burst_;
    mutable std::mutex mu_;
    std::unordered_map<std::string, Bucket> buckets_;
    std::size_t sweep_at_ = 1024;
};

} // namespace im
