// The lab's fault registry: which actions each point takes, and that nothing
// is ever armed or reported broken without --enable-faults.
#include "faults.hpp"

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
