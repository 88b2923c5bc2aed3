#include "typingbar.h"

#include <im/client.h>
#include <im/messagelistmodel.h>

#include <QtWidgets/QBoxLayout>
#include <QtWidgets/QLineEdit>
#include <QtWidgets/QTableView>

TypingBar::TypingBar(im::Client *client, im::MessageListModel *msgs, QLineEdit *editor, QWidget *parent)
    : QLabel(parent), client_(client), msgs_(msgs) {
    setObjectName(QStringLiteral("typingBar"));
    setStyleSheet(QStringLiteral("color: gray; font-style: italic"));
    // One line tall even when nobody types: the timeline does not jump.
    setMinimumHeight(fontMetrics().height());
    setToolTip(tr("Who else is typing here (Client::typingUsers(); each lasts 6 s unless renewed)"));
    connect(client_, &im::Client::typingChanged, this, [this](const QString &conv) {
        if (conv == msgs_->conversation())
            update();
    });
    connect(msgs_, &im::MessageListModel::conversationChanged, this, &TypingBar::update);
    if (editor) {
        // Every edit is a keystroke of the user: the SDK sends at once, then
        // renews every 3 s while edits keep coming and stops 5 s after the
        // last one. An emptied box stops at once.
        connect(editor, &QLineEdit::textEdited, this, [this](const QString &text) {
            const QString conv = msgs_->conversation();
            if (!conv.isEmpty())
                client_->setTyping(conv, !text.isEmpty());
        });
    }
    update();
}

TypingBar *TypingBar::attach(QWidget *messagePanel, im::Client *client, im::MessageListModel *msgs) {
    auto *bar = new TypingBar(client, msgs, messagePanel->findChild<QLineEdit *>(QStringLiteral("sendEdit")));
    auto *layout = qobject_cast<QBoxLayout *>(messagePanel->layout());
    auto *view = messagePanel->findChild<QTableView *>(QStringLiteral("messageView"));
    const int at = layout && view ? layout->indexOf(view) : -1;
    if (layout && at >= 0)
        layout->insertWidget(at + 1, bar);
    else if (layout)
        layout->addWidget(bar);
    else
        bar->setParent(messagePanel);
    return bar;
}

QString TypingBar::typingText(const QStringList &users) {
    switch (users.size()) {
    case 0: return {};
    case 1: return tr("%1 is typing…").arg(users[0]);
    case 2: return tr("%1 and %2 are typing…").arg(users[0], users[1]);
    case 3: return tr("%1, %2 and %3 are typing…").arg(users[0], users[1], users[2]);
    default: return tr("%1, %2 and %3 others are typing…").arg(users[0], users[1]).arg(users.size() - 2);
    }
}

void TypingBar::update() {
    const QString conv = msgs_->conversation();
    setText(conv.isEmpty() ? QString() : typingText(client_->typingUsers(conv)));
}
