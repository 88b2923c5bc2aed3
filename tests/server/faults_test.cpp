// The lab's fault registry: which actions each point takes, and that nothing
// is ever armed or reported broken without --enable-faults.
#include "core/faults.hpp"

#include <gtest/gtest.h>

using im::FaultKind;
using im::FaultRegistry;

TEST(Faults, rule_points_take_only_skip_and_skip_only_fits_rule_points) {
    FaultRegistry f(true);
    EXPECT_FALSE(f.arm("rule.cursor_ahead=skip").has_value());
    EXPECT_FALSE(f.arm("rule.goaway=skip:2").has_value());
    EXPECT_TRUE(f.arm("rule.cursor_ahead=crash").has_value());
    EXPECT_TRUE(f.arm("rule.epoch=unavailable").has_value());
    EXPECT_TRUE(f.arm("store.before_insert=skip").has_value());
    EXPECT_TRUE(f.arm("rule.no_such_rule=skip").has_value());
    EXPECT_FALSE(f.arm("rule.cursor_ahead=off").has_value());
}

TEST(Faults, an_armed_rule_is_broken_for_its_count_then_holds_again) {
    FaultRegistry f(true);
    EXPECT_FALSE(f.broken("rule.goaway"));
    ASSERT_FALSE(f.arm("rule.goaway=skip:2").has_value());
    EXPECT_TRUE(f.broken("rule.goaway"));
    EXPECT_TRUE(f.broken("rule.goaway"));
    EXPECT_FALSE(f.broken("rule.goaway"));
    ASSERT_FALSE(f.arm("rule.epoch=skip").has_value());
    EXPECT_FALSE(f.broken("rule.goaway"));
    EXPECT_TRUE(f.broken("rule.epoch"));
    ASSERT_FALSE(f.arm("rule.epoch=off").has_value());
    EXPECT_FALSE(f.broken("rule.epoch"));
}

TEST(Faults, without_enable_faults_nothing_arms_and_no_rule_is_broken) {
    FaultRegistry f(false);
    EXPECT_TRUE(f.arm("rule.cursor_ahead=skip").has_value());
    EXPECT_FALSE(f.broken("rule.cursor_ahead"));
    EXPECT_FALSE(f.hit("store.before_insert").has_value());
}

// rule.commit_before_crash moves an armed crash behind the COMMIT: take_crash
// takes exactly the crash armed at the point (one COUNT), nothing else, and
// nothing without --enable-faults.
TEST(Faults, take_crash_takes_one_armed_crash_and_nothing_else) {
    FaultRegistry f(true);
    EXPECT_FALSE(f.take_crash("store.before_commit"));
    ASSERT_FALSE(f.arm("store.before_commit=crash:1").has_value());
    ASSERT_FALSE(f.arm("store.before_insert=unavailable").has_value());
    EXPECT_FALSE(f.take_crash("store.before_insert")); // not a crash: left armed
    EXPECT_EQ(f.hit("store.before_insert"), FaultKind::unavailable);
    EXPECT_TRUE(f.take_crash("store.before_commit"));
    EXPECT_FALSE(f.take_crash("store.before_commit")); // its one COUNT is used: no crash at the point either
    EXPECT_FALSE(f.hit("store.before_commit").has_value());
    FaultRegistry off(false);
    EXPECT_FALSE(off.take_crash("store.before_commit"));
    EXPECT_FALSE(off.broken("rule.commit_before_crash"));
    EXPECT_FALSE(off.broken("rule.unavailable_terminal"));
    EXPECT_FALSE(off.broken("rule.recall_dedup"));
}
