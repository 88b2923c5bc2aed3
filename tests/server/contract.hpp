// The contract against a real imserver and a real PostgreSQL: each test
// sends real frames over a real WebSocket and asserts replies and rows.
// One executable (server_contract_test) of several files by subject
// (contract_*_test.cpp); their tests share this fixture, so the whole
// suite runs on one PostgreSQL cluster and one imserver, started once.
#pragma once

#include "common.hpp"

namespace im::test {

class Contract : public ServerSuite {};

} // namespace im::test
