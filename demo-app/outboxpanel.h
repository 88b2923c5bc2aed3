// The outbox panel of a chat window: the durable outbox in creation order
// (cmid, kind, conversation, body or target, attempts, last error, next
// retry, in flight, the `prev` its latest attempt named, and whether it is
// held: written under another user's token, obligation 10), the queue depth
// with the held count, Cancel for an entry that never went on the wire; the
// held drafts apart, in a table of their own (shown while there are some),
// with Discard held drafts.
#pragma once

#include <QtWidgets/QGroupBox>

namespace im {
class Client;
class OutboxModel;
} // namespace im

class QLabel;
class QTableView;
class RoleTableModel;

class OutboxPanel : public QGroupBox {
    Q_OBJECT
public:
    /// Columns of the outbox table.
    enum Column { OCmid, OKind, OConv, OWhat, OAttempts, OLastError, ONextRetry, OInFlight, OPrev, OHeld };

    OutboxPanel(im::Client *client, im::OutboxModel *outbox, QWidget *parent = nullptr);

    /// Called every 250 ms: the "next retry" countdown.
    void tick();

Q_SIGNALS:
    void statusMessage(const QString &text, int timeoutMs);
    /// What a cancel did (panelutil.h's texts).
    void actionDone(const QString &text);

private:
    void updateDepth();

    im::Client *client_;
    im::OutboxModel *outbox_;
    RoleTableModel *table_;     ///< entries to send (not held)
    RoleTableModel *heldTable_; ///< held drafts
    QTableView *view_;
    QTableView *heldView_;
    QWidget *heldBox_;
    QLabel *depth_;
};
