// The window of the QML example; the chat itself is ChatView.qml.
import QtQuick
import QtQuick.Controls

ApplicationWindow {
    id: window
    width: 800
    height: 560
    visible: true
    title: chat.client.userId ? "qmlchat - " + chat.client.userId : "qmlchat"

    // Set by main.cpp from the command line.
    required property string serverUrl
    required property string token
    required property var users
    required property string user
    required property string dataDir

    ChatView {
        id: chat
        anchors.fill: parent
        serverUrl: window.serverUrl
        token: window.token
        users: window.users
        user: window.user
        dataDir: window.dataDir
    }
}
