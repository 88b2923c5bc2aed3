// "ana is typing..." under the timeline of a chat window (contract section
// 13, obligation 19), and the other half: the send box tells the server
// that this user types (Client::setTyping on every edit, false when the box
// is emptied; a send stops it inside the SDK).
#pragma once

#include <QtWidgets/QLabel>

namespace im {
class Client;
class MessageListModel;
} // namespace im

class QLineEdit;

class TypingBar : public QLabel {
    Q_OBJECT
public:
    /// Follows the conversation `msgs` shows; `editor` (may be null) is the
    /// send box whose edits call setTyping().
    TypingBar(im::Client *client, im::MessageListModel *msgs, QLineEdit *editor, QWidget *parent = nullptr);

    /// Puts a TypingBar into `messagePanel` right under its timeline (the
    /// table "messageView"), driven by its send box ("sendEdit").
    static TypingBar *attach(QWidget *messagePanel, im::Client *client, im::MessageListModel *msgs);

    /// "ana is typing…", "ana and ben are typing…", "ana, ben and 2 others
    /// are typing…"; empty for nobody.
    static QString typingText(const QStringList &users);

private:
    void update();

    im::Client *client_;
    im::MessageListModel *msgs_;
};
