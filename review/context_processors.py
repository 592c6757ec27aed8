def collector_status(request):
    return {}
