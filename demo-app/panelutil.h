// Small pieces the panels of a chat window share: the table look, relative
// times, and the two outbox actions (cancel, discard) that more than one
// panel offers.
#pragma once

#include <QtCore/QString>

class QDateTime;
class QTableView;

namespace im {
class Client;
}

/// A read-only, row-selecting table view named `objectName`.
QTableView *makeTable(const QString &objectName);
/// "in 2.3 s", "now", or "-" for an invalid time.
QString relativeTime(const QDateTime &when);
/// Client::cancel(cmid); returns what happened ("Cancelled ...", "Not cancelled: ...").
QString cancelOutboxEntry(im::Client *client, const QString &cmid);
/// Client::discard(cmid); returns what happened ("Discarded ...", "Not discarded: ...").
QString discardMessage(im::Client *client, const QString &cmid);
