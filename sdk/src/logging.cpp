#include "logging_p.h"

namespace im {
Q_LOGGING_CATEGORY(lcClient, "im.sdk.client", QtInfoMsg)
Q_LOGGING_CATEGORY(lcConnection, "im.sdk.connection", QtInfoMsg)
Q_LOGGING_CATEGORY(lcOutbox, "im.sdk.outbox", QtInfoMsg)
Q_LOGGING_CATEGORY(lcStorage, "im.sdk.storage", QtInfoMsg)
} // namespace im
