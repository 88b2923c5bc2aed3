// Registers the public value types with the meta-type system.
#include <im/types.h>

namespace {
const int outboxEntryTypeId = qRegisterMetaType<im::OutboxEntry>();
} // namespace
