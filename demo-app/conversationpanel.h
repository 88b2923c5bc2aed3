// The conversation list of a chat window: every conversation the device
// knows with its unread count, head and read marker.
#pragma once

#include <QtWidgets/QGroupBox>

namespace im {
class ConversationListModel;
}

class QTableView;
class RoleTableModel;

class ConversationPanel : public QGroupBox {
    Q_OBJECT
public:
    explicit ConversationPanel(im::ConversationListModel *convs, QWidget *parent = nullptr);

    /// Highlights `conv` (no highlight when it is not listed); emits nothing.
    void showCurrent(const QString &conv);

Q_SIGNALS:
    /// The user picked another conversation.
    void conversationActivated(const QString &conv);
    /// Rows came or went (the window re-selects its conversation).
    void listChanged();
    /// A conversation's markers changed (head, read, unread, ...).
    void markersChanged();

private:
    im::ConversationListModel *convs_;
    RoleTableModel *table_;
    QTableView *view_;
    QString current_;
};
